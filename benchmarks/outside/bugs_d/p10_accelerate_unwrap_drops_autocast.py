"""P10 (class: mixed precision silently dropped mid-run) -- accelerate loop.

Modelled on huggingface/diffusers#1566 and its fix PR #1567/#1618 "dreambooth: fix #1566:
maintain fp32 wrapper when saving a checkpoint ..." and huggingface/accelerate PR #1025
"Change default for keep_fp32_wrapper": `accelerator.unwrap_model(model,
keep_fp32_wrapper=False)` does not return a cleaned *copy*: it strips the autocast /
convert-outputs-to-fp32 wrapper from `model.forward` *in place*, so when the training
script goes on with the same model object after saving a checkpoint, the forward pass is
no longer autocast (in the diffusers fp16 DreamBooth case training then crashed; with
fp32 weights + bf16 mixed precision it silently trains in fp32 from then on).  See also
huggingface/accelerate#948 "Should I do 'accelerator.prepare()' again after
'accelerator.unwrap_model()' ?".

A diffusers-style DDPM training loop (tiny conv denoiser, epsilon prediction, linear beta
schedule) with `Accelerator(mixed_precision="bf16", gradient_accumulation_steps=2)` on CPU.
Every `checkpointing_steps=12` optimizer steps the main process saves the unwrapped
weights.  The buggy script passes `keep_fp32_wrapper=False`, so from optimizer step 12 on
the model runs without bf16 autocast.  Healthy twin: `keep_fp32_wrapper=True` (the default).
"""
import sys, os, math, time
import torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.data import TensorDataset, DataLoader
from accelerate import Accelerator
from accelerate.utils import set_seed

HEALTHY = "--healthy" in sys.argv
torch.set_num_threads(1)

args = dict(resolution=16, train_batch_size=16, gradient_accumulation_steps=2, max_train_steps=36,
            learning_rate=2e-3, lr_warmup_steps=4, checkpointing_steps=12, output_dir="bugsd_p10_ckpt",
            num_train_timesteps=200)


class TimeEmbedding(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.SiLU(), nn.Linear(4 * dim, dim))

    def forward(self, t):
        half = self.dim // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
        emb = t.float()[:, None] * freqs[None]
        return self.mlp(torch.cat([emb.sin(), emb.cos()], -1))


class ResBlock(nn.Module):
    def __init__(self, c, tdim):
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(8, c), nn.Conv2d(c, c, 3, padding=1)
        self.t = nn.Linear(tdim, c)
        self.n2, self.c2 = nn.GroupNorm(8, c), nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x, temb):
        h = self.c1(F.silu(self.n1(x))) + self.t(temb)[:, :, None, None]
        return x + self.c2(F.silu(self.n2(h)))


class TinyUNet(nn.Module):
    def __init__(self, c=32, tdim=32):
        super().__init__()
        self.temb = TimeEmbedding(tdim)
        self.conv_in = nn.Conv2d(1, c, 3, padding=1)
        self.down = ResBlock(c, tdim)
        self.pool = nn.Conv2d(c, c, 3, stride=2, padding=1)
        self.mid = ResBlock(c, tdim)
        self.up = nn.ConvTranspose2d(c, c, 2, stride=2)
        self.up_block = ResBlock(c, tdim)
        self.conv_out = nn.Conv2d(c, 1, 3, padding=1)

    def forward(self, x, t):
        temb = self.temb(t)
        h1 = self.down(self.conv_in(x), temb)
        h = self.mid(self.pool(h1), temb)
        h = self.up_block(self.up(h) + h1, temb)
        return self.conv_out(F.silu(h))


def make_dataset(n, g):
    s = args["resolution"]
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, s), torch.linspace(-1, 1, s), indexing="ij")
    cx, cy = torch.rand(n, 1, 1, generator=g) - 0.5, torch.rand(n, 1, 1, generator=g) - 0.5
    r = 0.2 + 0.3 * torch.rand(n, 1, 1, generator=g)
    img = ((xx - cx) ** 2 + (yy - cy) ** 2 < r ** 2).float() * 2 - 1          # in [-1, 1]
    return TensorDataset(img.unsqueeze(1))


def main():
    accelerator = Accelerator(cpu=True, mixed_precision="bf16",
                              gradient_accumulation_steps=args["gradient_accumulation_steps"])
    set_seed(0)
    model = TinyUNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args["learning_rate"], weight_decay=1e-2)
    dataset = make_dataset(args["max_train_steps"] * args["gradient_accumulation_steps"] * args["train_batch_size"],
                           torch.Generator().manual_seed(1))
    train_dataloader = DataLoader(dataset, batch_size=args["train_batch_size"], shuffle=True)
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / args["lr_warmup_steps"]))
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, lr_scheduler)

    T = args["num_train_timesteps"]
    betas = torch.linspace(1e-4, 0.02, T)
    alphas_cumprod = torch.cumprod(1 - betas, 0)

    t0 = time.time()
    global_step = 0
    model.train()
    for step, (clean_images,) in enumerate(train_dataloader):
        noise = torch.randn_like(clean_images)
        timesteps = torch.randint(0, T, (clean_images.shape[0],))
        a = alphas_cumprod[timesteps].sqrt()[:, None, None, None]
        s = (1 - alphas_cumprod[timesteps]).sqrt()[:, None, None, None]
        noisy_images = a * clean_images + s * noise

        with accelerator.accumulate(model):
            noise_pred = model(noisy_images, timesteps)
            loss = F.mse_loss(noise_pred.float(), noise)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()

        if accelerator.sync_gradients:
            global_step += 1
            if global_step % 4 == 0:
                accelerator.print(f"step {global_step:2d} loss {loss.item():.4f} lr {lr_scheduler.get_last_lr()[0]:.2e}")
            if global_step % args["checkpointing_steps"] == 0 and global_step < args["max_train_steps"]:
                if accelerator.is_main_process:
                    save_path = os.path.join(args["output_dir"], f"checkpoint-{global_step}")
                    os.makedirs(save_path, exist_ok=True)
                    unet = accelerator.unwrap_model(model, keep_fp32_wrapper=HEALTHY)
                    torch.save(unet.state_dict(), os.path.join(save_path, "unet.pt"))
                    accelerator.print(f"Saved state to {save_path}")
                    if not HEALTHY and global_step == args["checkpointing_steps"]:
                        print("ONSET step", global_step)
            if global_step >= args["max_train_steps"]:
                break

    # quick eval: denoising loss at a few fixed timesteps on held-out shapes
    model.eval()
    val = make_dataset(64, torch.Generator().manual_seed(2)).tensors[0]
    with torch.no_grad():
        g = torch.Generator().manual_seed(3)
        losses = []
        for tt in (20, 100, 180):
            n = torch.randn(val.shape, generator=g)
            ts = torch.full((val.shape[0],), tt)
            x = alphas_cumprod[tt].sqrt() * val + (1 - alphas_cumprod[tt]).sqrt() * n
            losses.append(F.mse_loss(model(x, ts).float(), n).item())
    accelerator.print(f"val eps-mse @t=20/100/180: {[round(l, 4) for l in losses]}  ({time.time() - t0:.1f}s)")
    accelerator.end_training()


if __name__ == "__main__":
    main()
