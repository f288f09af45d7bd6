"""Healthy probe: a DDPM training loop in the style of diffusers' examples/unconditional_image_generation/train_unconditional.py written without diffusers: a linear-beta noise schedule, add_noise at random timesteps, epsilon-prediction mse_loss, AdamW with a per-step LambdaLR warm-up and clip_grad_norm_, and an EMA copy of the denoiser updated after every optimizer step with torch._foreach_lerp_ under torch.no_grad() with diffusers' warm-up decay min(max_decay, (1 + step) / (10 + step)) (timm's ModelEmaV3 uses the same lerp); every few steps the EMA model, kept in eval mode, draws samples with a strided DDIM sampler (eta=0) under torch.no_grad().

The denoiser has GroupNorm and Dropout; the EMA copy never takes gradients and its buffers
are copied with the weights.
"""
import argparse
import copy
import math

import torch
import torch.nn.functional as F
from torch import nn


def timestep_embedding(t, dim):
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([args.sin(), args.cos()], dim=1)


class TinyUNet(nn.Module):
    def __init__(self, ch=16, temb=32, p=0.1):
        super().__init__()
        self.temb = nn.Sequential(nn.Linear(temb, ch), nn.SiLU(), nn.Linear(ch, ch))
        self.inp = nn.Conv2d(1, ch, 3, padding=1)
        self.block = nn.Sequential(nn.GroupNorm(4, ch), nn.SiLU(), nn.Dropout(p), nn.Conv2d(ch, ch, 3, padding=1))
        self.out = nn.Sequential(nn.GroupNorm(4, ch), nn.SiLU(), nn.Conv2d(ch, 1, 3, padding=1))
        self.temb_dim = temb

    def forward(self, x, t):
        h = self.inp(x) + self.temb(timestep_embedding(t, self.temb_dim))[:, :, None, None]
        h = h + self.block(h)
        return self.out(h)


class Schedule:
    def __init__(self, num_train_timesteps=50, beta_start=1e-4, beta_end=0.2):
        self.T = num_train_timesteps
        self.betas = torch.linspace(beta_start, beta_end, self.T)
        self.alphas = 1.0 - self.betas
        self.alphas_cumprod = torch.cumprod(self.alphas, 0)

    def add_noise(self, x0, noise, t):
        a = self.alphas_cumprod[t].sqrt()[:, None, None, None]
        s = (1 - self.alphas_cumprod[t]).sqrt()[:, None, None, None]
        return a * x0 + s * noise

    @torch.no_grad()
    def sample(self, model, n, gen):
        x = torch.randn(n, 1, 8, 8, generator=gen)
        for t in reversed(range(0, self.T, 5)):        # strided deterministic DDIM (eta=0) keeps the probe short
            tt = torch.full((n,), t, dtype=torch.long)
            eps = model(x, tt)
            a_bar, prev = self.alphas_cumprod[t], self.alphas_cumprod[t - 5] if t >= 5 else torch.tensor(1.0)
            x0 = ((x - (1 - a_bar).sqrt() * eps) / a_bar.sqrt()).clamp(-1, 1)
            x = prev.sqrt() * x0 + (1 - prev).sqrt() * eps
        return x


class EMA:
    def __init__(self, model, max_decay=0.9999):
        self.model = copy.deepcopy(model).eval().requires_grad_(False)
        self.max_decay, self.optimization_step = max_decay, 0

    @torch.no_grad()
    def step(self, model):
        self.optimization_step += 1
        decay = min(self.max_decay, (1 + self.optimization_step) / (10 + self.optimization_step))
        ema_params = list(self.model.parameters())
        torch._foreach_lerp_(ema_params, [p.detach() for p in model.parameters()], 1.0 - decay)
        for ema_b, b in zip(self.model.buffers(), model.buffers()):
            ema_b.copy_(b)


def synthetic_images(gen, n):
    yy, xx = torch.meshgrid(torch.arange(8.0), torch.arange(8.0), indexing="ij")
    centre = torch.rand(n, 2, generator=gen) * 6 + 1
    d2 = (yy[None] - centre[:, 0, None, None]) ** 2 + (xx[None] - centre[:, 1, None, None]) ** 2
    return (torch.exp(-d2 / 3.0) * 2 - 1).unsqueeze(1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr-warmup-steps", type=int, default=3)
    parser.add_argument("--sample-every", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)

    sched = Schedule()
    model = TinyUNet()
    ema = EMA(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.95, 0.999), weight_decay=1e-6)
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / args.lr_warmup_steps))
    model.train()
    for step in range(args.steps):
        clean = synthetic_images(gen, args.batch_size)
        noise = torch.randn(clean.shape, generator=gen)
        timesteps = torch.randint(0, sched.T, (args.batch_size,), generator=gen)
        noisy = sched.add_noise(clean, noise, timesteps)
        loss = F.mse_loss(model(noisy, timesteps), noise)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()
        ema.step(model)
        print(f"step {step + 1} loss {loss.item():.4f} lr {lr_scheduler.get_last_lr()[0]:.2e}")
        if (step + 1) % args.sample_every == 0:
            images = sched.sample(ema.model, 4, gen)
            print(f"  ema samples mean {images.mean().item():.3f} std {images.std().item():.3f}")


if __name__ == "__main__":
    main()
