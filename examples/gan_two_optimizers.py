"""A small GAN on a 2-D ring of Gaussians: generator and discriminator with their own
Adam optimizers (betas 0.5/0.999), alternating updates, ``detach()`` on fake samples for
the discriminator step."""

from __future__ import annotations

import argparse
import math

import torch
from torch import nn
from torch.nn import functional as F


def ring(generator: torch.Generator, n: int) -> torch.Tensor:
    angle = torch.randint(0, 8, (n,), generator=generator).float() * (2 * math.pi / 8)
    centres = torch.stack([angle.cos(), angle.sin()], dim=1) * 2
    return centres + 0.05 * torch.randn(n, 2, generator=generator)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    gen = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))
    disc = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3, betas=(0.5, 0.999))

    for step in range(args.steps):
        real = ring(generator, 64)
        fake = gen(torch.randn(64, 4, generator=generator))

        opt_d.zero_grad()
        d_loss = F.binary_cross_entropy_with_logits(disc(real), torch.ones(64, 1)) + \
            F.binary_cross_entropy_with_logits(disc(fake.detach()), torch.zeros(64, 1))
        d_loss.backward()
        opt_d.step()

        opt_g.zero_grad()
        g_loss = F.binary_cross_entropy_with_logits(disc(fake), torch.ones(64, 1))
        g_loss.backward()
        opt_g.step()
        if step % 5 == 0:
            print(f"step {step} d {d_loss.item():.3f} g {g_loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
