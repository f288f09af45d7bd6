"""A small DiT (adaLN-Zero transformer on patchified 4x8x8 latents) trained as an
epsilon-prediction DDPM (T = 1000) under bf16 autocast on CPU, with a timestep-range
curriculum: the first 10 optimizer steps sample only low-noise timesteps t < 250, after
which the full range [0, 1000) is used.

Modelled on: modelscope/DiffSynth-Studio issue #562 "Timestep changes when use bfloat16"
(``timestep.to(dtype=self.torch_dtype)``: 999.3986 -> 1000, 987.17 -> 988) and its fix PR
#1025 "Fix sinusoidal_embedding calculation for bf16 precision" (keep the timestep in fp32
and only cast the embedding), also huggingface/diffusers issue #9405 (750 -> 752 in bf16).
The training step casts the timestep tensor to the mixed-precision ``weight_dtype`` before
the model call, as many training scripts cast every model input.  bf16 has 8 significant
bits, so integers up to 256 survive, but from the curriculum switch on, timesteps in
[256, 512) are rounded to multiples of 2 and those in [512, 1000) to multiples of 4: the
model is conditioned on the wrong noise level (the sinusoidal embedding's fastest
frequency is 1 rad per timestep) while the noise itself is added at the true level.

Unusual about the loop: a data-independent curriculum changes the sampled timestep range
partway, adaLN-Zero blocks (zero-initialised modulation), EMA of the weights, bf16
autocast with fp32 master weights, cosine LR decay.
Run: python p09_dit_bf16_timestep_rounding_curriculum.py [--healthy]
"""
import argparse
import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true")
args = parser.parse_args()
torch.manual_seed(0)

T, STEPS, STAGE1, BATCH, DIM = 1000, 30, 10, 64, 64
weight_dtype = torch.bfloat16  # --mixed_precision bf16

betas = torch.linspace(1e-4, 0.02, T, dtype=torch.float64)
alphas_cumprod = torch.cumprod(1 - betas, 0).float()


def sinusoidal_embedding_1d(dim, position):
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float64) / half)
    args_ = position.to(torch.float64)[:, None] * freqs[None]
    return torch.cat([torch.cos(args_), torch.sin(args_)], 1).float()


class DiTBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM, elementwise_affine=False), nn.LayerNorm(DIM, elementwise_affine=False)
        self.attn = nn.MultiheadAttention(DIM, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(approximate="tanh"), nn.Linear(4 * DIM, DIM))
        self.ada = nn.Linear(DIM, 6 * DIM)
        nn.init.zeros_(self.ada.weight)
        nn.init.zeros_(self.ada.bias)

    def forward(self, x, c):
        s1, b1, g1, s2, b2, g2 = self.ada(F.silu(c))[:, None].chunk(6, 2)
        h = self.norm1(x) * (1 + s1) + b1
        x = x + g1 * self.attn(h, h, h, need_weights=False)[0]
        return x + g2 * self.mlp(self.norm2(x) * (1 + s2) + b2)


class TinyDiT(nn.Module):
    def __init__(self, depth=3):
        super().__init__()
        self.patch = nn.Linear(4 * 2 * 2, DIM)
        self.pos = nn.Parameter(torch.randn(1, 16, DIM) * 0.02)
        self.time_embedding = nn.Sequential(nn.Linear(256, DIM), nn.SiLU(), nn.Linear(DIM, DIM))
        self.blocks = nn.ModuleList([DiTBlock() for _ in range(depth)])
        self.out = nn.Linear(DIM, 4 * 2 * 2)
        nn.init.zeros_(self.out.weight)

    def forward(self, x, timestep):
        b = x.size(0)
        tokens = x.unfold(2, 2, 2).unfold(3, 2, 2).permute(0, 2, 3, 1, 4, 5).reshape(b, 16, 16)
        h = self.patch(tokens) + self.pos
        c = self.time_embedding(sinusoidal_embedding_1d(256, timestep))
        for blk in self.blocks:
            h = blk(h, c)
        out = self.out(h).reshape(b, 4, 4, 4, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, 4, 8, 8)
        return out


def make_latents(n, g):
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, 8), torch.linspace(-1, 1, 8), indexing="ij")
    k = torch.randint(0, 4, (n,), generator=g)
    phase = torch.rand(n, 1, 1, generator=g) * 6.28
    base = torch.stack([torch.sin(3 * xx + phase[i]) if k[i] % 2 == 0 else torch.cos(3 * yy + phase[i]) for i in range(n)])
    chans = torch.stack([base, base * 0.5 + 0.1 * k[:, None, None], -base, torch.tanh(2 * base)], 1)
    return chans + 0.05 * torch.randn(n, 4, 8, 8, generator=g)


g = torch.Generator().manual_seed(1)
latents_all = make_latents(1024, g)
dit = TinyDiT()
ema = copy.deepcopy(dit).requires_grad_(False)
optimizer = torch.optim.AdamW(dit.parameters(), lr=1e-3, weight_decay=0.0)
lr_sched = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=STEPS, eta_min=1e-4)
rng = torch.Generator().manual_seed(2)

max_t_err, max_emb_err, onset = 0.0, 0.0, None
for step in range(STEPS):
    t_max = 250 if step < STAGE1 else T  # timestep-range curriculum
    latents = latents_all[torch.randint(0, len(latents_all), (BATCH,), generator=rng)]
    noise = torch.randn(latents.shape, generator=rng)
    timestep = torch.randint(0, t_max, (BATCH,), generator=rng).float()
    a = alphas_cumprod[timestep.long()][:, None, None, None]
    noisy_latents = a.sqrt() * latents + (1 - a).sqrt() * noise
    if args.healthy:
        model_t = timestep.to(torch.float32)  # PR #1025: keep the timestep in fp32
    else:
        model_t = timestep.to(dtype=weight_dtype)
    t_err = (model_t.float() - timestep).abs().max().item()
    max_t_err = max(max_t_err, t_err)
    max_emb_err = max(max_emb_err, (sinusoidal_embedding_1d(256, model_t) - sinusoidal_embedding_1d(256, timestep)).abs().max().item())
    if onset is None and (timestep.to(weight_dtype).float() != timestep).any():
        onset = step
        if not args.healthy:
            print(f"ONSET step {step}")
    with torch.autocast("cpu", dtype=weight_dtype):
        noise_pred = dit(noisy_latents, model_t)
    loss = F.mse_loss(noise_pred.float(), noise)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(dit.parameters(), 1.0)
    optimizer.step()
    lr_sched.step()
    with torch.no_grad():
        for pe, p in zip(ema.parameters(), dit.parameters()):
            pe.lerp_(p, 1 - 0.9)
    print(f"step {step} t_max {t_max} loss {loss.item():.4f} max_timestep_error {t_err:.1f}")

with torch.no_grad():  # held-out denoising loss at t=601 (a level bf16 cannot represent)
    x0 = make_latents(256, torch.Generator().manual_seed(9))
    n = torch.randn(x0.shape, generator=torch.Generator().manual_seed(10))
    t = torch.full((256,), 601.0)
    a = alphas_cumprod[601]
    with torch.autocast("cpu", dtype=weight_dtype):
        val = F.mse_loss(ema(a.sqrt() * x0 + (1 - a).sqrt() * n, t).float(), n).item()
print(f"EVIDENCE max |timestep seen by the model - true timestep| {max_t_err:.1f}; max time-embedding error {max_emb_err:.3f}; "
      f"first step with a bf16-unrepresentable timestep {onset}; EMA val loss at t=601 {val:.4f}")
