"""Modelled on huggingface/diffusers examples/unconditional_image_generation/
train_unconditional.py (DDPM training with Accelerator, EMAModel, cosine LR schedule with
warmup, gradient accumulation, clip_grad_norm_ under sync_gradients, periodic sampling with
the EMA weights via store()/copy_to()/restore(), save_state checkpoints).

diffusers is not installed, so the pieces are re-implemented the way diffusers does them: a
tiny time-conditioned conv UNet (one down/up level with skip connection and sinusoidal
timestep embedding), a DDPMScheduler-like linear beta schedule with add_noise() and the
ancestral sampling step, and an EMAModel with the inv_gamma/power warmup decay.  Data are
synthetic 1x16x16 Gaussian-blob images scaled to [-1, 1].  Accelerator(cpu=True,
mixed_precision="bf16", gradient_accumulation_steps=2); 48 optimizer steps."""
import math, os
import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from transformers import get_cosine_schedule_with_warmup

# ------------------------------------------------------------------ data
def blob_images(n, g):
    yy, xx = torch.meshgrid(torch.arange(16.), torch.arange(16.), indexing="ij")
    c = 4 + 8 * torch.rand(n, 2, generator=g)
    s = 1.5 + 1.5 * torch.rand(n, 1, 1, generator=g)
    img = torch.exp(-((xx - c[:, 0, None, None]) ** 2 + (yy - c[:, 1, None, None]) ** 2) / (2 * s ** 2))
    return (img * 2 - 1).unsqueeze(1)

# ------------------------------------------------------------------ DDPM scheduler
class DDPMScheduler:
    def __init__(self, num_train_timesteps=100, beta_start=1e-4, beta_end=0.02):
        self.num_train_timesteps = num_train_timesteps
        self.betas = torch.linspace(beta_start, beta_end, num_train_timesteps)
        self.alphas = 1.0 - self.betas
        self.alphas_cumprod = torch.cumprod(self.alphas, dim=0)

    def add_noise(self, original_samples, noise, timesteps):
        sqrt_alpha_prod = self.alphas_cumprod[timesteps].sqrt().view(-1, 1, 1, 1)
        sqrt_one_minus_alpha_prod = (1 - self.alphas_cumprod[timesteps]).sqrt().view(-1, 1, 1, 1)
        return sqrt_alpha_prod * original_samples + sqrt_one_minus_alpha_prod * noise

    def step(self, model_output, t, sample, generator=None):
        alpha_prod_t = self.alphas_cumprod[t]
        alpha_prod_t_prev = self.alphas_cumprod[t - 1] if t > 0 else torch.tensor(1.0)
        beta_prod_t = 1 - alpha_prod_t
        current_alpha_t = alpha_prod_t / alpha_prod_t_prev
        current_beta_t = 1 - current_alpha_t
        pred_original_sample = ((sample - beta_prod_t ** 0.5 * model_output) / alpha_prod_t ** 0.5).clamp(-1, 1)
        pred_original_sample_coeff = (alpha_prod_t_prev ** 0.5 * current_beta_t) / beta_prod_t
        current_sample_coeff = current_alpha_t ** 0.5 * (1 - alpha_prod_t_prev) / beta_prod_t
        pred_prev_sample = pred_original_sample_coeff * pred_original_sample + current_sample_coeff * sample
        if t > 0:
            variance = ((1 - alpha_prod_t_prev) / (1 - alpha_prod_t) * current_beta_t).clamp(min=1e-20)
            noise = torch.randn(model_output.shape, generator=generator)
            pred_prev_sample = pred_prev_sample + variance ** 0.5 * noise
        return pred_prev_sample

# ------------------------------------------------------------------ model
def timestep_embedding(t, dim):
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.sin(args), torch.cos(args)], dim=-1)

class ResBlock(nn.Module):
    def __init__(self, cin, cout, tdim):
        super().__init__()
        self.norm1 = nn.GroupNorm(8, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.temb = nn.Linear(tdim, cout)
        self.norm2 = nn.GroupNorm(8, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()
    def forward(self, x, temb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.temb(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return h + self.skip(x)

class TinyUNet(nn.Module):
    def __init__(self, ch=32, tdim=64):
        super().__init__()
        self.tdim = tdim
        self.time_mlp = nn.Sequential(nn.Linear(tdim, tdim), nn.SiLU(), nn.Linear(tdim, tdim))
        self.conv_in = nn.Conv2d(1, ch, 3, padding=1)
        self.down = ResBlock(ch, ch, tdim)
        self.downsample = nn.Conv2d(ch, ch, 3, stride=2, padding=1)
        self.mid = ResBlock(ch, 2 * ch, tdim)
        self.upsample = nn.Upsample(scale_factor=2, mode="nearest")
        self.up = ResBlock(3 * ch, ch, tdim)
        self.norm_out = nn.GroupNorm(8, ch)
        self.conv_out = nn.Conv2d(ch, 1, 3, padding=1)
    def forward(self, x, t):
        temb = self.time_mlp(timestep_embedding(t, self.tdim))
        h0 = self.down(self.conv_in(x), temb)
        h = self.mid(self.downsample(h0), temb)
        h = self.up(torch.cat([self.upsample(h), h0], dim=1), temb)
        return self.conv_out(F.silu(self.norm_out(h)))

# ------------------------------------------------------------------ EMA (diffusers.training_utils.EMAModel)
class EMAModel:
    def __init__(self, parameters, decay=0.9999, min_decay=0.0, update_after_step=0,
                 use_ema_warmup=True, inv_gamma=1.0, power=2 / 3):
        parameters = list(parameters)
        self.shadow_params = [p.clone().detach() for p in parameters]
        self.decay, self.min_decay, self.update_after_step = decay, min_decay, update_after_step
        self.use_ema_warmup, self.inv_gamma, self.power = use_ema_warmup, inv_gamma, power
        self.optimization_step = 0
        self.cur_decay_value = None
        self.temp_stored_params = None

    def get_decay(self, optimization_step):
        step = max(0, optimization_step - self.update_after_step - 1)
        if step <= 0:
            return 0.0
        if self.use_ema_warmup:
            cur_decay_value = 1 - (1 + step / self.inv_gamma) ** -self.power
        else:
            cur_decay_value = (1 + step) / (10 + step)
        cur_decay_value = min(cur_decay_value, self.decay)
        return max(cur_decay_value, self.min_decay)

    @torch.no_grad()
    def step(self, parameters):
        self.optimization_step += 1
        decay = self.get_decay(self.optimization_step)
        self.cur_decay_value = decay
        one_minus_decay = 1 - decay
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

    def state_dict(self):
        return {"decay": self.decay, "optimization_step": self.optimization_step,
                "shadow_params": self.shadow_params}

# ------------------------------------------------------------------ training
def main():
    output_dir = "out/accelerate_ddpm_ema"
    accelerator = Accelerator(cpu=True, mixed_precision="bf16", gradient_accumulation_steps=2)
    set_seed(0)
    torch.set_num_threads(1)   # tiny UNet on CPU; avoid OpenMP oversubscription
    g = torch.Generator().manual_seed(0)
    dataset = torch.utils.data.TensorDataset(blob_images(768, g))
    train_dataloader = torch.utils.data.DataLoader(dataset, batch_size=16, shuffle=True)

    model = TinyUNet()
    ema_model = EMAModel(model.parameters(), decay=0.999, use_ema_warmup=True, inv_gamma=1.0, power=3 / 4)
    noise_scheduler = DDPMScheduler(num_train_timesteps=100)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.95, 0.999), weight_decay=1e-6, eps=1e-8)
    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / accelerator.gradient_accumulation_steps)
    num_epochs = 2
    lr_scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=4,
                                                   num_training_steps=num_update_steps_per_epoch * num_epochs)
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(model, optimizer, train_dataloader, lr_scheduler)

    global_step = 0
    for epoch in range(num_epochs):
        model.train()
        for step, (clean_images,) in enumerate(train_dataloader):
            noise = torch.randn(clean_images.shape, dtype=clean_images.dtype, device=clean_images.device)
            bsz = clean_images.shape[0]
            timesteps = torch.randint(0, noise_scheduler.num_train_timesteps, (bsz,), device=clean_images.device).long()
            noisy_images = noise_scheduler.add_noise(clean_images, noise, timesteps)

            with accelerator.accumulate(model):
                model_output = model(noisy_images, timesteps)
                loss = F.mse_loss(model_output.float(), noise.float())
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()

            if accelerator.sync_gradients:
                ema_model.step(model.parameters())
                global_step += 1
                if global_step % 8 == 0:
                    accelerator.print(f"step {global_step}: loss {loss.detach().item():.4f} "
                                      f"lr {lr_scheduler.get_last_lr()[0]:.2e} ema_decay {ema_model.cur_decay_value:.4f}")
        accelerator.wait_for_everyone()

        # ---- sample with the EMA weights (store / copy_to / restore as in diffusers)
        if accelerator.is_main_process:
            unet = accelerator.unwrap_model(model)
            ema_model.store(unet.parameters())
            ema_model.copy_to(unet.parameters())
            unet.eval()
            gen = torch.Generator().manual_seed(0)
            image = torch.randn(8, 1, 16, 16, generator=gen)
            with torch.no_grad():
                for t in reversed(range(noise_scheduler.num_train_timesteps)):
                    model_out = unet(image, torch.full((8,), t, dtype=torch.long))
                    image = noise_scheduler.step(model_out, t, image, generator=gen)
            ema_model.restore(unet.parameters())
            image = (image / 2 + 0.5).clamp(0, 1)
            accelerator.print(f"epoch {epoch}: sampled images mean {image.mean():.3f} std {image.std():.3f} "
                              f"(data mean {(dataset.tensors[0] / 2 + 0.5).mean():.3f})")
            accelerator.save_state(os.path.join(output_dir, f"checkpoint-{global_step}"))
            torch.save(ema_model.state_dict(), os.path.join(output_dir, "ema_unet.pt"))
    accelerator.print(f"total optimizer steps: {global_step}")
    accelerator.end_training()

if __name__ == "__main__":
    main()
