"""Lazy R1 gradient penalty computed from *scaled* input gradients under AMP (GradScaler).

Bug class: loss scaling leaking into a loss term: a gradient penalty built
with ``torch.autograd.grad`` on ``scaler.scale(...)`` but never unscaled, so the
penalty is multiplied by scale**2 whenever it is applied.

Modelled on: pytorch/pytorch PR #44667 "Small clarification to amp gradient
penalty example", requested by the discuss.pytorch.org thread "What is the
correct way of computing a grad penalty using AMP?" (t/95827): gradients
returned by ``autograd.grad`` of a scaled loss are scaled and must be divided
by ``scaler.get_scale()`` before forming the penalty.  The loop is a
StyleGAN2-style non-saturating GAN (softplus losses, lazy R1 regularization of
the discriminator every ``D_REG_EVERY`` iterations, weight multiplied by the
interval), run with fp16 ``torch.autocast`` and one shared ``GradScaler`` for
both optimizers, on a synthetic 16-dim mixture-of-Gaussians data set.

What goes wrong: on the iterations without regularization everything is
correct.  On every lazy-regularization iteration the R1 term is ``scale**2``
(about 1e9) times too large; its backward overflows in the fp16 part of the
graph, so the scaler silently skips that discriminator step and halves the
loss scale.  From the first regularized step on, R1 is never applied, D misses
one update in eight and the loss scale keeps collapsing (32768 -> 1024 in this
run, where the twin stays at 32768).  No error, no warning; the logged
adversarial losses look normal.

Healthy twin: the input gradients are multiplied by ``1 / scaler.get_scale()``
before the penalty is formed (as in the AMP examples).

Onset: iterations are counted from 1 and each does one D step then one G step;
the first regularized D step is in iteration 8, preceded by 7 D + 7 G steps, so
the first affected optimizer step is K = 14 (40 iterations = 80 steps).
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)
torch.manual_seed(0)

DIM, Z_DIM, BATCH, N_ITERS = 16, 8, 64, 40
D_REG_EVERY, R1_GAMMA = 8, 1.0
AMP = dict(device_type="cpu", dtype=torch.float16)


def sample_real(n, gen):
    centers = torch.tensor([[2.0] * 8 + [-2.0] * 8, [-2.0] * 8 + [2.0] * 8, [0.0] * 16])
    idx = torch.randint(0, 3, (n,), generator=gen)
    return centers[idx] + 0.3 * torch.randn(n, DIM, generator=gen)


def mlp(i, o, h=128):
    return nn.Sequential(nn.Linear(i, h), nn.LeakyReLU(0.2), nn.Linear(h, h), nn.LeakyReLU(0.2),
                         nn.Linear(h, o))


G, D = mlp(Z_DIM, DIM), mlp(DIM, 1)
g_opt = torch.optim.Adam(G.parameters(), lr=2e-3, betas=(0.0, 0.99))
d_opt = torch.optim.Adam(D.parameters(), lr=2e-3 * D_REG_EVERY / (D_REG_EVERY + 1),
                         betas=(0.0, 0.99 ** (D_REG_EVERY / (D_REG_EVERY + 1))))
scaler = torch.amp.GradScaler("cpu")
gen = torch.Generator().manual_seed(1)
n_opt_steps = 0

for it in range(1, N_ITERS + 1):
    # ---- discriminator ----
    real = sample_real(BATCH, gen)
    z = torch.randn(BATCH, Z_DIM, generator=gen)
    d_regularize = it % D_REG_EVERY == 0
    if d_regularize:
        real.requires_grad_(True)
    with torch.autocast(**AMP):
        fake = G(z).detach()
        real_pred = D(real)
        fake_pred = D(fake)
        d_loss = F.softplus(fake_pred).mean() + F.softplus(-real_pred).mean()
    d_adv = d_loss.item()
    if d_regularize:
        (grad_real,) = torch.autograd.grad(scaler.scale(real_pred.float().sum()), real, create_graph=True)
        if HEALTHY:
            grad_real = grad_real * (1.0 / scaler.get_scale())
        elif it == D_REG_EVERY:
            print(f"ONSET iteration {it - 1}")
        r1 = grad_real.pow(2).sum(1).mean()
        d_loss = d_loss + R1_GAMMA / 2 * r1 * D_REG_EVERY
    d_opt.zero_grad(set_to_none=True)
    scaler.scale(d_loss).backward()
    scaler.step(d_opt)
    n_opt_steps += 1

    # ---- generator ----
    z = torch.randn(BATCH, Z_DIM, generator=gen)
    with torch.autocast(**AMP):
        g_loss = F.softplus(-D(G(z))).mean()
    g_opt.zero_grad(set_to_none=True)
    scaler.scale(g_loss).backward()
    scaler.step(g_opt)
    n_opt_steps += 1
    scaler.update()

    if it % 10 == 0:
        print(f"iter {it} d_adv {d_adv:.3f} g_loss {g_loss.item():.3f}")

with torch.no_grad():
    samples = G(torch.randn(512, Z_DIM, generator=gen))
print(f"sample mean |x| {samples.abs().mean().item():.3f} (data ~1.4)")
print("done")
