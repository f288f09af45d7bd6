"""P10 (class: EMA weights copied into the *online* training model and never restored -- each validation
silently rewinds the model being optimised to its exponential moving average) -- HuggingFace accelerate loop in
the style of diffusers' examples/unconditional_image_generation/train_unconditional.py.

Modelled on huggingface/diffusers#2321 "Not copying the model in inference and assigning ema_weights seems
incorrect": after a refactor the example stopped copying the model for the validation pipeline and called
`ema_model.copy_to(unet.parameters())` directly on the unwrapped *training* UNet (the maintainers agreed: the
prepared and unwrapped model share parameters, so EMA tensors overwrite the non-EMA ones); diffusers PR #2302
then added `EMAModel.store()/restore()` for exactly this.  Same bug later reported as
PKU-YuanGroup/Open-Sora-Plan#186 "Missed to restore model weights in training after validation with EMA on".

Program: a small conditional-on-timestep conv denoiser trained as a DDPM (epsilon prediction) on synthetic
8x8 blob images with `Accelerator(gradient_accumulation_steps=2)`, AdamW + cosine
warm-up schedule, grad clipping, diffusers-style EMAModel with warm-up decay, and a validation pass (EMA weights,
short DDPM sampling + held-out denoising loss) at the end of every epoch (12 optimizer steps).  The buggy
variant does `ema.copy_to(unet.parameters())` without store()/restore(), so optimisation resumes from the EMA
weights at optimizer step 12 (and again at 24).  Healthy twin: store() before and restore() after validation.
"""
import argparse
import math
import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed

parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true")
parser.add_argument("--num_epochs", type=int, default=3)
parser.add_argument("--steps_per_epoch", type=int, default=12, help="optimizer steps per epoch")
parser.add_argument("--train_batch_size", type=int, default=16)
parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
parser.add_argument("--learning_rate", type=float, default=2e-3)
parser.add_argument("--lr_warmup_steps", type=int, default=4)
parser.add_argument("--ema_inv_gamma", type=float, default=1.0)
parser.add_argument("--ema_power", type=float, default=3 / 4)
parser.add_argument("--ema_max_decay", type=float, default=0.9999)
parser.add_argument("--ddpm_num_steps", type=int, default=100)
args = parser.parse_args()
HEALTHY = args.healthy


class DDPMScheduler:
    def __init__(self, num_train_timesteps=100, beta_start=1e-4, beta_end=0.02):
        self.num_train_timesteps = num_train_timesteps
        self.betas = torch.linspace(beta_start, beta_end, num_train_timesteps)
        self.alphas = 1.0 - self.betas
        self.alphas_cumprod = torch.cumprod(self.alphas, 0)

    def add_noise(self, x0, noise, t):
        a = self.alphas_cumprod[t].view(-1, 1, 1, 1)
        return a.sqrt() * x0 + (1 - a).sqrt() * noise

    @torch.no_grad()
    def sample(self, model, shape, generator, stride=10):
        x = torch.randn(shape, generator=generator)
        ts = list(range(self.num_train_timesteps - 1, -1, -stride))
        for i, t in enumerate(ts):
            a_t = self.alphas_cumprod[t]
            a_prev = self.alphas_cumprod[ts[i + 1]] if i + 1 < len(ts) else torch.tensor(1.0)
            eps = model(x, torch.full((shape[0],), t, dtype=torch.long)).float()
            x0 = ((x - (1 - a_t).sqrt() * eps) / a_t.sqrt()).clamp(-1, 1)
            x = a_prev.sqrt() * x0 + (1 - a_prev).sqrt() * eps  # deterministic DDIM-style update
        return x


class EMAModel:
    """Minimal diffusers.training_utils.EMAModel (step / copy_to / store / restore)."""

    def __init__(self, parameters, decay=0.9999, inv_gamma=1.0, power=2 / 3, use_ema_warmup=True):
        self.shadow_params = [p.clone().detach() for p in parameters]
        self.decay, self.inv_gamma, self.power, self.use_ema_warmup = decay, inv_gamma, power, use_ema_warmup
        self.optimization_step = 0
        self.temp_stored_params = None

    def get_decay(self, optimization_step):
        step = max(0, optimization_step - 1)
        if step <= 0:
            return 0.0
        if self.use_ema_warmup:
            cur = 1 - (1 + step / self.inv_gamma) ** -self.power
        else:
            cur = (1 + step) / (10 + step)
        return min(cur, self.decay)

    @torch.no_grad()
    def step(self, parameters):
        self.optimization_step += 1
        one_minus_decay = 1 - self.get_decay(self.optimization_step)
        for s_param, param in zip(self.shadow_params, parameters):
            if param.requires_grad:
                s_param.sub_(one_minus_decay * (s_param - param))
            else:
                s_param.copy_(param)

    def copy_to(self, parameters):
        for s_param, param in zip(self.shadow_params, parameters):
            param.data.copy_(s_param.to(param.device).data)

    def store(self, parameters):
        self.temp_stored_params = [param.detach().cpu().clone() for param in parameters]

    def restore(self, parameters):
        for c_param, param in zip(self.temp_stored_params, parameters):
            param.data.copy_(c_param.data)
        self.temp_stored_params = None


class TinyUNet(nn.Module):
    def __init__(self, ch=16, time_dim=32):
        super().__init__()
        self.time_mlp = nn.Sequential(nn.Linear(time_dim, time_dim * 2), nn.SiLU(), nn.Linear(time_dim * 2, ch))
        self.time_dim = time_dim
        self.conv_in = nn.Conv2d(1, ch, 3, padding=1)
        self.down = nn.Sequential(nn.GroupNorm(8, ch), nn.SiLU(), nn.Conv2d(ch, ch * 2, 3, stride=2, padding=1))
        self.mid = nn.Sequential(nn.GroupNorm(8, ch * 2), nn.SiLU(), nn.Conv2d(ch * 2, ch * 2, 3, padding=1))
        self.up = nn.Sequential(nn.GroupNorm(8, ch * 2), nn.SiLU(), nn.ConvTranspose2d(ch * 2, ch, 4, 2, 1))
        self.conv_out = nn.Sequential(nn.GroupNorm(8, ch * 2), nn.SiLU(), nn.Conv2d(ch * 2, 1, 3, padding=1))

    def timestep_embedding(self, t):
        half = self.time_dim // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half) / half)
        args_ = t.float()[:, None] * freqs[None]
        return torch.cat([args_.sin(), args_.cos()], dim=-1)

    def forward(self, x, t):
        h0 = self.conv_in(x) + self.time_mlp(self.timestep_embedding(t))[:, :, None, None]
        h = self.down(h0)
        h = h + self.mid(h)
        h = self.up(h)
        return self.conv_out(torch.cat([h, h0], dim=1))


def make_images(n, g):
    yy, xx = torch.meshgrid(torch.arange(8).float(), torch.arange(8).float(), indexing="ij")
    cy = torch.rand(n, 1, 1, generator=g) * 5 + 1.5
    cx = torch.rand(n, 1, 1, generator=g) * 5 + 1.5
    img = torch.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / 3.0)
    return (img * 2 - 1).unsqueeze(1)


def main():
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps, mixed_precision="no",
                              cpu=True)
    set_seed(0)
    model = TinyUNet()
    ema_model = EMAModel(model.parameters(), decay=args.ema_max_decay, inv_gamma=args.ema_inv_gamma,
                         power=args.ema_power, use_ema_warmup=True)
    noise_scheduler = DDPMScheduler(num_train_timesteps=args.ddpm_num_steps)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, betas=(0.95, 0.999), weight_decay=1e-6)
    g = torch.Generator().manual_seed(1)
    n_micro = args.num_epochs * args.steps_per_epoch * args.gradient_accumulation_steps
    train_images = make_images(n_micro * args.train_batch_size // args.num_epochs, g)
    dataset = torch.utils.data.TensorDataset(train_images)
    train_dataloader = torch.utils.data.DataLoader(dataset, batch_size=args.train_batch_size, shuffle=True,
                                                   generator=torch.Generator().manual_seed(2))
    max_train_steps = args.num_epochs * args.steps_per_epoch

    def lr_lambda(step):
        if step < args.lr_warmup_steps:
            return (step + 1) / args.lr_warmup_steps
        progress = (step - args.lr_warmup_steps) / max(1, max_train_steps - args.lr_warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * progress))

    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(model, optimizer, train_dataloader,
                                                                           lr_scheduler)
    val_images = make_images(64, torch.Generator().manual_seed(3))
    val_noise = torch.randn(val_images.shape, generator=torch.Generator().manual_seed(4))
    val_t = torch.randint(0, args.ddpm_num_steps, (64,), generator=torch.Generator().manual_seed(5))

    global_step = 0
    for epoch in range(args.num_epochs):
        model.train()
        for step, (clean_images,) in enumerate(train_dataloader):
            noise = torch.randn(clean_images.shape)
            timesteps = torch.randint(0, noise_scheduler.num_train_timesteps, (clean_images.shape[0],))
            noisy_images = noise_scheduler.add_noise(clean_images, noise, timesteps)
            with accelerator.accumulate(model):
                model_output = model(noisy_images, timesteps)
                loss = F.mse_loss(model_output.float(), noise)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                ema_model.step(model.parameters())
                if global_step % 4 == 0:
                    print(f"epoch {epoch} step {global_step} loss {loss.detach().item():.4f} "
                          f"lr {lr_scheduler.get_last_lr()[0]:.2e} "
                          f"ema_decay {ema_model.get_decay(ema_model.optimization_step):.4f}")
                global_step += 1
        accelerator.wait_for_everyone()

        # ---- validation / "save images" at the end of every epoch, with the EMA weights ----
        if accelerator.is_main_process:
            unet = accelerator.unwrap_model(model)
            if HEALTHY:
                ema_model.store(unet.parameters())
            ema_model.copy_to(unet.parameters())  # BUG (buggy variant): never restored below
            unet.eval()
            with torch.no_grad():
                noisy = noise_scheduler.add_noise(val_images, val_noise, val_t)
                val_loss = F.mse_loss(unet(noisy, val_t).float(), val_noise).item()
                samples = noise_scheduler.sample(unet, (16, 1, 8, 8), torch.Generator().manual_seed(6))
            print(f"[validation] epoch {epoch} (EMA weights): denoise_loss {val_loss:.4f} "
                  f"sample_mean {samples.mean().item():.3f} sample_std {samples.std().item():.3f}")
            if HEALTHY:
                ema_model.restore(unet.parameters())
            unet.train()
            if epoch == 0 and not HEALTHY:
                print(f"ONSET step {global_step}")  # training resumes from the EMA weights
        if epoch == args.num_epochs - 1:
            accelerator.save_state("p10_checkpoint")
            torch.save({"ema": ema_model.shadow_params, "step": global_step}, "p10_ema.pt")
    print(f"done: {global_step} optimizer steps")


if __name__ == "__main__":
    main()
