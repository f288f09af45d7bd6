"""A spectrally-normalised GAN (SNGAN-style) on a 2-D ring of Gaussians, as a healthy
reference pipeline.

The discriminator's layers use ``torch.nn.utils.spectral_norm`` (the hook-based API that
SNGAN/BigGAN-era code uses), hinge losses, two Adam optimizers with betas (0.0, 0.9) and
two discriminator updates per generator update. Every ``--eval-every`` steps both
networks are put in ``eval()`` to score a fixed batch of samples, then back in
``train()``: evaluation forwards of spectrally-normalised layers are ordinary once the
layers have run in training mode, which they do from the first step.
"""

from __future__ import annotations

import argparse
import math
import warnings

import torch
from torch import nn
from torch.nn import functional as F

warnings.filterwarnings("ignore", category=FutureWarning)  # the legacy spectral_norm API is deliberate


def ring(generator: torch.Generator, n: int) -> torch.Tensor:
    angle = torch.randint(0, 8, (n,), generator=generator).float() * (2 * math.pi / 8)
    centres = torch.stack([angle.cos(), angle.sin()], dim=1) * 2
    return centres + 0.05 * torch.randn(n, 2, generator=generator)


def sn_discriminator() -> nn.Module:
    sn = nn.utils.spectral_norm
    return nn.Sequential(sn(nn.Linear(2, 32)), nn.LeakyReLU(0.1), sn(nn.Linear(32, 32)), nn.LeakyReLU(0.1),
                         sn(nn.Linear(32, 1)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=2)
    parser.add_argument("--critic-steps", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    gen = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))
    disc = sn_discriminator()
    opt_g = torch.optim.Adam(gen.parameters(), lr=2e-4, betas=(0.0, 0.9))
    opt_d = torch.optim.Adam(disc.parameters(), lr=2e-4, betas=(0.0, 0.9))
    fixed_noise = torch.randn(64, 4, generator=generator)

    gen.train()
    disc.train()
    d_updates = 0
    while d_updates < args.steps:
        for _ in range(args.critic_steps):
            if d_updates >= args.steps:
                break
            real = ring(generator, 64)
            with torch.no_grad():
                fake = gen(torch.randn(64, 4, generator=generator))
            opt_d.zero_grad()
            d_loss = F.relu(1 - disc(real)).mean() + F.relu(1 + disc(fake)).mean()
            d_loss.backward()
            opt_d.step()
            d_updates += 1
            if d_updates % args.eval_every == 0:
                gen.eval()
                disc.eval()
                with torch.no_grad():
                    score = disc(gen(fixed_noise)).mean().item()
                gen.train()
                disc.train()
                print(f"update {d_updates} d {d_loss.item():.3f} fixed-sample score {score:.3f}", flush=True)
        if d_updates >= args.steps:
            break
        opt_g.zero_grad()
        g_loss = -disc(gen(torch.randn(64, 4, generator=generator))).mean()
        g_loss.backward()
        opt_g.step()


if __name__ == "__main__":
    main()
