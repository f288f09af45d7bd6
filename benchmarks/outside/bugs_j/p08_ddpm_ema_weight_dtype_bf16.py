"""Class-conditional DDPM on 2-D point clouds (two shapes) with a frozen label
encoder, bf16 mixed precision on CPU and an EMA copy of the denoiser that is
started after a warm-up, DreamBooth-script style (``weight_dtype`` for every
module that is not trained).

Modelled on: d8ahazard/sd_dreambooth_extension PR #1415 / #1417 "Use float32
for EMA model": "This affects models that have weight_dtype set to float16 or
bfloat16, and use_ema is true. Due to fp16/bf16 not having enough precision to
represent differences to a weight on the order of 0.001 times the current
value, almost all EMA weight updates get rounded down to 0. This means that the
ema model never actually gets updated from the running weights. The solution
is to always keep the EMA model in float32, regardless of weight_dtype."

Unusual about the loop: the EMA is created lazily at ``ema_start_step`` (10)
from the current weights and updated diffusers-``EMAModel``-style
(``s -= (1 - decay) * (s - p)``) with min_decay 0.995; the frozen label
encoder is cast to weight_dtype; forward/backward run under
``torch.autocast('cpu', dtype=torch.bfloat16)`` with fp32 master weights;
cosine noise schedule; AdamW with warm-up.
Run: python p08_ddpm_ema_weight_dtype_bf16.py [--healthy]
"""
import argparse
import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)


def sample_shapes(n, g):
    y = torch.randint(0, 2, (n,), generator=g)
    t = 2 * math.pi * torch.rand(n, generator=g)
    ring = torch.stack([torch.cos(t), torch.sin(t)], 1) * 1.5
    r = torch.rand(n, generator=g) * 3 + 0.5
    spiral = torch.stack([r * torch.cos(2 * r), r * torch.sin(2 * r)], 1) / 2
    x = torch.where(y[:, None] == 0, ring, spiral) + 0.05 * torch.randn(n, 2, generator=g)
    return x, y


def timestep_embedding(t, dim=32):
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half) / half)
    args = t[:, None].float() * freqs[None]
    return torch.cat([torch.sin(args), torch.cos(args)], -1)


class Denoiser(nn.Module):
    def __init__(self, hidden=128):
        super().__init__()
        self.inp = nn.Linear(2 + 32 + 16, hidden)
        self.blocks = nn.ModuleList([nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, hidden), nn.SiLU())
                                     for _ in range(3)])
        self.out = nn.Linear(hidden, 2)

    def forward(self, x, t, cond):
        h = self.inp(torch.cat([x, timestep_embedding(t), cond], -1))
        for blk in self.blocks:
            h = h + blk(h)
        return self.out(h)


class EMAModel:
    def __init__(self, model, decay=0.9999, min_decay=0.995):
        self.shadow = copy.deepcopy(model).requires_grad_(False)
        self.decay, self.min_decay, self.optimization_step = decay, min_decay, 0

    def get_decay(self, step):
        return max(min(self.decay, (1 + step) / (10 + step)), self.min_decay)

    @torch.no_grad()
    def step(self, model):
        self.optimization_step += 1
        one_minus_decay = 1 - self.get_decay(self.optimization_step)
        for s_param, param in zip(self.shadow.parameters(), model.parameters()):
            s_param.sub_(one_minus_decay * (s_param - param))

    def to(self, dtype):
        self.shadow.to(dtype=dtype)
        return self


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--healthy", action="store_true")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--ema_start_step", type=int, default=10)
    args = parser.parse_args()
    torch.manual_seed(0)
    weight_dtype = torch.bfloat16  # mixed_precision == "bf16"

    T = 200
    s = 0.008
    steps = torch.arange(T + 1) / T
    alphas_cumprod = torch.cos((steps + s) / (1 + s) * math.pi / 2) ** 2
    alphas_cumprod = (alphas_cumprod / alphas_cumprod[0])[1:].clamp(1e-5, 1.0)

    label_encoder = nn.Embedding(2, 16).requires_grad_(False).to(dtype=weight_dtype)  # frozen
    model = Denoiser()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: min(1.0, (k + 1) / 5))
    g = torch.Generator().manual_seed(1)
    ema, ema_init = None, None

    for step in range(args.steps):
        if step == args.ema_start_step:
            ema = EMAModel(model)
            if not args.healthy:
                ema.to(weight_dtype)       # same dtype as the other non-trained modules
                print(f"ONSET step {step}")
            ema_init = [p.detach().float().clone() for p in ema.shadow.parameters()]
        x0, y = sample_shapes(256, g)
        t = torch.randint(0, T, (256,), generator=g)
        noise = torch.randn(x0.shape, generator=g)
        a = alphas_cumprod[t][:, None]
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        with torch.autocast("cpu", dtype=torch.bfloat16):
            cond = label_encoder(y)
            pred = model(xt, t, cond)
        loss = F.mse_loss(pred.float(), noise)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if ema is not None:
            ema.step(model)
        if step % 10 == 0:
            print(f"step {step:3d} loss {loss.item():.4f}")

    drift = math.sqrt(sum(((p.detach().float() - p0) ** 2).sum().item()
                          for p, p0 in zip(ema.shadow.parameters(), ema_init)))
    frozen_frac = sum((p.detach().float() == p0).sum().item() for p, p0 in zip(ema.shadow.parameters(), ema_init)) \
        / sum(p0.numel() for p0 in ema_init)
    gap = math.sqrt(sum(((p.detach().float() - q.detach()) ** 2).sum().item()
                        for p, q in zip(ema.shadow.parameters(), model.parameters())))
    print(f"EVIDENCE ema dtype={next(ema.shadow.parameters()).dtype} | EMA drift since creation={drift:.4f} "
          f"| EMA entries never updated={frozen_frac:.3f} | ||EMA - online||={gap:.4f}")


if __name__ == "__main__":
    main()
