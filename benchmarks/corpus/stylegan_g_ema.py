"""A small non-saturating GAN on a synthetic 2-D ring of Gaussians, with an EMA copy of the generator.

Modelled on: NVlabs/stylegan2-ada-pytorch (https://github.com/NVlabs/stylegan2-ada-pytorch,
training/training_loop.py, training/loss.py, training/networks.py)
Habits reproduced: a generator split into a mapping network (tracking ``w_avg`` as a buffer,
updated by ``lerp`` during training and used for truncation) and a synthesis network, a
``G_ema = copy.deepcopy(G).eval().requires_grad_(False)``, separate Adam optimizers for G and D
with ``betas=(0.0, 0.99)``, ``requires_grad_`` toggled on the module each phase trains, a D step
(softplus non-saturating loss plus an R1 penalty on reals from ``torch.autograd.grad`` with
``create_graph=True``) then a G step each iteration, then the G_ema update under
``torch.no_grad()`` with ``ema_beta = 0.5 ** (batch / ema_nimg)`` and a rampup of ``ema_nimg``
with ``cur_nimg``, parameters updated by ``p_ema.copy_(p.lerp(p_ema, ema_beta))`` and buffers by
``b_ema.copy_(b)``, and final samples drawn from G_ema in eval mode under ``torch.no_grad()``.
"""

from __future__ import annotations

import argparse
import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class FC(nn.Sequential):
    def __init__(self, in_features, out_features, act=True):
        layers = [nn.Linear(in_features, out_features)]
        if act:
            layers.append(nn.LeakyReLU(0.2))
        super().__init__(*layers)


class MappingNetwork(nn.Module):
    def __init__(self, z_dim, w_dim, num_layers=2, w_avg_beta=0.995):
        super().__init__()
        self.w_avg_beta = w_avg_beta
        self.net = nn.Sequential(*[FC(z_dim if i == 0 else w_dim, w_dim) for i in range(num_layers)])
        self.register_buffer("w_avg", torch.zeros(w_dim))

    def forward(self, z, truncation_psi=1.0):
        x = F.normalize(z, dim=1) * math.sqrt(z.shape[1])  # normalize_2nd_moment
        w = self.net(x)
        if self.training:
            self.w_avg.copy_(w.detach().mean(dim=0).lerp(self.w_avg, self.w_avg_beta))
        if truncation_psi != 1:
            w = self.w_avg.lerp(w, truncation_psi)
        return w


class Generator(nn.Module):
    def __init__(self, z_dim=8, w_dim=32, out_dim=2):
        super().__init__()
        self.z_dim = z_dim
        self.mapping = MappingNetwork(z_dim, w_dim)
        self.synthesis = nn.Sequential(FC(w_dim, 64), FC(64, 64), FC(64, out_dim, act=False))

    def forward(self, z, truncation_psi=1.0):
        return self.synthesis(self.mapping(z, truncation_psi=truncation_psi))


class Discriminator(nn.Module):
    def __init__(self, in_dim=2):
        super().__init__()
        self.net = nn.Sequential(FC(in_dim, 64), FC(64, 64), FC(64, 1, act=False))

    def forward(self, x):
        return self.net(x)


def ring_of_gaussians(n, generator, modes=8, radius=2.0, std=0.05):
    k = torch.randint(0, modes, (n,), generator=generator)
    angle = 2 * math.pi * k.float() / modes
    centres = torch.stack([radius * angle.cos(), radius * angle.sin()], dim=1)
    return centres + std * torch.randn(n, 2, generator=generator)


def main():
    parser = argparse.ArgumentParser(description="Non-saturating GAN with a generator EMA")
    parser.add_argument("--steps", type=int, default=20, help="generator steps in total")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--glr", type=float, default=0.002)
    parser.add_argument("--dlr", type=float, default=0.002)
    parser.add_argument("--r1-gamma", type=float, default=0.1)
    parser.add_argument("--ema-kimg", type=float, default=1.0, help="half-life of the G_ema, in kimg")
    # the original ramps over 5% of a long run; a short run needs a faster ramp to reach beta ~0.95
    parser.add_argument("--ema-rampup", type=float, default=4.0, help="ema_nimg capped at cur_nimg * rampup")
    parser.add_argument("--log-every", type=int, default=5)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    data_generator = torch.Generator().manual_seed(args.seed)

    G = Generator().train().requires_grad_(False)
    D = Discriminator().train().requires_grad_(False)
    G_ema = copy.deepcopy(G).eval().requires_grad_(False)

    opt_G = torch.optim.Adam(G.parameters(), lr=args.glr, betas=(0.0, 0.99), eps=1e-8)
    opt_D = torch.optim.Adam(D.parameters(), lr=args.dlr, betas=(0.0, 0.99), eps=1e-8)

    cur_nimg = 0
    batch_idx = 0
    while batch_idx < args.steps:
        real = ring_of_gaussians(args.batch, data_generator)

        # Dmain + Dr1: push D(real) up and D(G(z)) down, penalise the gradient at reals.
        D.requires_grad_(True)
        opt_D.zero_grad(set_to_none=True)
        with torch.no_grad():
            fake = G(torch.randn(args.batch, G.z_dim))
        loss_Dgen = F.softplus(D(fake))
        real_tmp = real.detach().requires_grad_(True)
        real_logits = D(real_tmp)
        loss_Dreal = F.softplus(-real_logits)
        r1_grads = torch.autograd.grad(outputs=[real_logits.sum()], inputs=[real_tmp], create_graph=True)[0]
        loss_Dr1 = r1_grads.square().sum(dim=1) * (args.r1_gamma / 2)
        (loss_Dgen.mean() + loss_Dreal.mean() + loss_Dr1.mean()).backward()
        opt_D.step()
        D.requires_grad_(False)

        # Gmain: non-saturating generator loss.
        G.requires_grad_(True)
        opt_G.zero_grad(set_to_none=True)
        gen_logits = D(G(torch.randn(args.batch, G.z_dim)))
        loss_Gmain = F.softplus(-gen_logits).mean()
        loss_Gmain.backward()
        opt_G.step()
        G.requires_grad_(False)

        # Update G_ema.
        with torch.no_grad():
            ema_nimg = args.ema_kimg * 1000
            if args.ema_rampup is not None:
                ema_nimg = min(ema_nimg, cur_nimg * args.ema_rampup)
            ema_beta = 0.5 ** (args.batch / max(ema_nimg, 1e-8))
            for p_ema, p in zip(G_ema.parameters(), G.parameters()):
                p_ema.copy_(p.lerp(p_ema, ema_beta))
            for b_ema, b in zip(G_ema.buffers(), G.buffers()):
                b_ema.copy_(b)

        cur_nimg += args.batch
        batch_idx += 1
        if batch_idx % args.log_every == 0 or batch_idx == args.steps:
            loss_D = loss_Dgen.mean().item() + loss_Dreal.mean().item()
            print(f"tick {batch_idx} kimg {cur_nimg / 1000:.3f} loss/D {loss_D:.4f} loss/G {loss_Gmain.item():.4f} "
                  f"ema_beta {ema_beta:.4f}")

    G_ema.eval()
    with torch.no_grad():
        samples = G_ema(torch.randn(256, G_ema.z_dim), truncation_psi=0.7)
    print(f"samples: mean radius {samples.norm(dim=1).mean().item():.3f}")


if __name__ == "__main__":
    main()
