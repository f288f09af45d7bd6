"""Tiny DDPM on a 2-D point cloud (two moons), trained with a compiled denoiser and an EMA copy.

Modelled on: tanelp/tiny-diffusion (ddpm.py: MLP denoiser with sinusoidal embeddings,
linear beta schedule, epsilon-prediction MSE) with the EMA + warm-up conventions of
Ho et al.'s DDPM reference implementation (hojonathanho/diffusion).

Unusual but intended:
  * the denoiser is wrapped in torch.compile for the training step only; the EMA copy that
    is used for sampling is an eager, uncompiled torch.optim.swa_utils.AveragedModel;
  * the learning rate warms up linearly *from 0*, so the very first optimizer step does not
    move the weights;
  * evaluation samples are drawn with a dedicated torch.Generator that is re-seeded on every
    evaluation, so the sample quality numbers are comparable across evaluations;
  * evaluation happens every 20 steps in the middle of the (infinite) stream of batches.
"""
import math
import time

import torch
import torch._inductor.config
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

torch.set_num_threads(1)
torch._inductor.config.compile_threads = 1  # small CPU box: skip inductor's parallel compile worker pool
torch.manual_seed(0)


def make_moons(n, gen, noise=0.05):
    n1 = n // 2
    n2 = n - n1
    t1 = torch.rand(n1, generator=gen) * math.pi
    t2 = torch.rand(n2, generator=gen) * math.pi
    a = torch.stack([torch.cos(t1), torch.sin(t1)], 1)
    b = torch.stack([1 - torch.cos(t2), 0.5 - torch.sin(t2)], 1)
    x = torch.cat([a, b]) + noise * torch.randn(n, 2, generator=gen)
    return (x - torch.tensor([0.5, 0.25])) * 2.0


class SinusoidalEmbedding(nn.Module):
    def __init__(self, size, scale=1.0):
        super().__init__()
        self.size, self.scale = size, scale

    def forward(self, x):
        x = x * self.scale
        half = self.size // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=x.device) / (half - 1))
        emb = x.unsqueeze(-1) * freqs.unsqueeze(0)
        return torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)


class Block(nn.Module):
    def __init__(self, size):
        super().__init__()
        self.ff = nn.Linear(size, size)
        self.act = nn.GELU()

    def forward(self, x):
        return x + self.act(self.ff(x))


class MLP(nn.Module):
    def __init__(self, hidden=128, emb=64, layers=3):
        super().__init__()
        self.time_emb = SinusoidalEmbedding(emb)
        self.in_emb = SinusoidalEmbedding(emb, scale=25.0)
        concat = 3 * emb
        body = [nn.Linear(concat, hidden), nn.GELU()] + [Block(hidden) for _ in range(layers)]
        self.joint = nn.Sequential(*body, nn.Linear(hidden, 2))

    def forward(self, x, t):
        h = torch.cat([self.in_emb(x[:, 0]), self.in_emb(x[:, 1]), self.time_emb(t.float())], -1)
        return self.joint(h)


class NoiseScheduler:
    def __init__(self, T=50, beta_start=1e-4, beta_end=0.02):
        self.T = T
        self.betas = torch.linspace(beta_start, beta_end * 1000 / T, T)
        self.alphas = 1.0 - self.betas
        self.alphas_cumprod = torch.cumprod(self.alphas, 0)
        self.alphas_cumprod_prev = F.pad(self.alphas_cumprod[:-1], (1, 0), value=1.0)

    def add_noise(self, x0, noise, t):
        s1 = self.alphas_cumprod[t].sqrt().unsqueeze(1)
        s2 = (1 - self.alphas_cumprod[t]).sqrt().unsqueeze(1)
        return s1 * x0 + s2 * noise

    def step(self, eps, t, x, gen):
        a, ab, abp, b = self.alphas[t], self.alphas_cumprod[t], self.alphas_cumprod_prev[t], self.betas[t]
        x0 = ((x - (1 - ab).sqrt() * eps) / ab.sqrt()).clamp(-4.0, 4.0)  # clip_denoised, as in DDPM
        mean = (abp.sqrt() * b / (1 - ab)) * x0 + (a.sqrt() * (1 - abp) / (1 - ab)) * x
        if t > 0:
            var = (b * (1 - abp) / (1 - ab)).clamp(min=1e-20)
            mean = mean + var.sqrt() * torch.randn(x.shape, generator=gen)
        return mean


@torch.no_grad()
def evaluate(ema_model, sched, ref, seed=1234, n=512):
    gen = torch.Generator().manual_seed(seed)  # re-seeded every call: identical noise each eval
    x = torch.randn(n, 2, generator=gen)
    ema_model.eval()
    for t in reversed(range(sched.T)):
        tt = torch.full((n,), t, dtype=torch.long)
        x = sched.step(ema_model(x, tt), t, x, gen)
    # crude sample quality: symmetric chamfer distance to held-out data
    d = torch.cdist(x, ref)
    return 0.5 * (d.min(1).values.mean() + d.min(0).values.mean()).item()


def main():
    data_gen = torch.Generator().manual_seed(0)
    train = make_moons(8000, data_gen)
    ref = make_moons(512, data_gen)
    sched = NoiseScheduler(T=50)

    model = MLP()
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.95))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0)
    total_steps, warmup = 60, 10
    lr_lambda = lambda s: min(s / warmup, 0.5 * (1 + math.cos(math.pi * (s - warmup) / (total_steps - warmup))))
    lr_sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)

    compiled = torch.compile(model)

    def train_step(x0):
        noise = torch.randn_like(x0)
        t = torch.randint(0, sched.T, (x0.shape[0],))
        pred = compiled(sched.add_noise(x0, noise, t), t)
        return F.mse_loss(pred, noise)

    batch_size = 256
    t0 = time.time()
    for step in range(total_steps):
        model.train()
        idx = torch.randint(0, train.shape[0], (batch_size,))
        loss = train_step(train[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lr_sched.step()
        ema.update_parameters(model)
        if step % 10 == 0:
            print(f"step {step:3d} loss {loss.item():.4f} lr {lr_sched.get_last_lr()[0]:.2e}")
        if (step + 1) % 20 == 0:
            print(f"  eval @ {step + 1}: chamfer(EMA samples, data) = {evaluate(ema.module, sched, ref):.4f}")
    print(f"done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
