"""Toy DDPM (noise-prediction MLP) on a 2-D "8 gaussians" dataset with a progressive batch schedule.

Stage 1 trains in fp32 with a small batch.  For stage 2 the batch size is quadrupled and, to
keep memory/time in budget, the run switches to bfloat16.  Optimizer: SGD with Nesterov momentum
and a cosine learning-rate decay over the whole run.

Modelled on: tianweiy/CausVid issue #19 "training use bf16" — the user "manually loaded all the
model with self.model = self.model.to(dtype=torch.bfloat16)" instead of using mixed precision
and the generator "is unable to converge"; the maintainer: the parameters are stored in the
dtype they have, "so all those parameter update / etc.. will suffer if we cast it to bfloat16".
With bf16 master weights, most SGD updates are smaller than half a bf16 ulp of the weight and
round away to nothing.

Unusual about the loop: the precision switch happens at a schedule phase boundary, so the
fp32 stage-1 steps are identical in both variants.
--healthy: stage 2 keeps fp32 master weights and runs the forward under
torch.autocast("cpu", dtype=torch.bfloat16) (real mixed precision).
"""
import contextlib
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv

T = 100


def sample_data(n, g):
    k = torch.randint(0, 8, (n,), generator=g).float()
    centers = torch.stack([torch.cos(k * math.pi / 4), torch.sin(k * math.pi / 4)], 1) * 2.0
    return centers + 0.1 * torch.randn(n, 2, generator=g)


class TimeEmbedding(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, t):
        half = self.dim // 2
        freqs = torch.exp(-math.log(1000.0) * torch.arange(half, dtype=torch.float32) / half)
        args = t.float()[:, None] * freqs[None]
        return torch.cat([args.sin(), args.cos()], dim=-1).to(t.dtype)


class Denoiser(nn.Module):
    def __init__(self, hidden=128):
        super().__init__()
        self.temb = nn.Sequential(TimeEmbedding(32), nn.Linear(32, hidden), nn.SiLU())
        self.inp = nn.Linear(2, hidden)
        self.blocks = nn.ModuleList([nn.Sequential(nn.SiLU(), nn.Linear(hidden, hidden)) for _ in range(3)])
        self.out = nn.Linear(hidden, 2)

    def forward(self, x, t):
        h = self.inp(x) + self.temb(t.to(self.inp.weight.dtype))
        for blk in self.blocks:
            h = h + blk(h)
        return self.out(h)


def main():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    betas = torch.linspace(1e-4, 0.05, T)
    alpha_bar = torch.cumprod(1 - betas, 0)
    model = Denoiser()
    stage1_steps, total_steps = 12, 40
    base_lr = 0.01
    optimizer = torch.optim.SGD(model.parameters(), lr=base_lr, momentum=0.9, nesterov=True)
    sched = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * s / total_steps)))

    autocast = contextlib.nullcontext()
    bs, dtype = 128, torch.float32
    for step in range(total_steps):
        if step == stage1_steps:
            bs = 512
            if HEALTHY:
                autocast = torch.autocast("cpu", dtype=torch.bfloat16)
            else:
                model = model.to(torch.bfloat16)
                dtype = torch.bfloat16
                print(f"ONSET step {step}")
            before = [p.detach().float().clone() for p in model.parameters()]
        x0 = sample_data(bs, g)
        t = torch.randint(0, T, (bs,), generator=g)
        eps = torch.randn(bs, 2, generator=g)
        ab = alpha_bar[t][:, None]
        xt = ab.sqrt() * x0 + (1 - ab).sqrt() * eps
        with autocast:
            pred = model(xt.to(dtype), t)
        loss = F.mse_loss(pred.float(), eps)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        sched.step()
        print(f"step {step:3d} bs {bs} loss {loss.item():.4f} lr {sched.get_last_lr()[0]:.5f}")

    after = [p.detach().float() for p in model.parameters()]
    changed = sum((a != b).sum().item() for a, b in zip(after, before))
    n = sum(a.numel() for a in after)
    moved = sum((a - b).norm() ** 2 for a, b in zip(after, before)) ** 0.5
    print(f"EVIDENCE param_dtype={next(model.parameters()).dtype} "
          f"stage2_fraction_of_weights_changed={changed / n:.3f} stage2_param_update_norm={moved:.5f} "
          f"final_loss={loss.item():.4f}")


if __name__ == "__main__":
    main()
