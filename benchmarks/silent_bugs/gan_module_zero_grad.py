"""A GAN that clears gradients through the modules, as pytorch/examples' DCGAN does
(``netD.zero_grad()`` / ``netG.zero_grad()``, never ``optimizer.zero_grad()``).

The generator's loss back-propagates through the discriminator, leaving gradients on
``netD``; the next discriminator update is only correct because ``netD.zero_grad()``
clears them first. From the onset that call is dropped (moved into a branch for a warm-up
phase that has ended): the discriminator steps on its own accumulated gradients plus the
generator's leaked ones.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from _common import bug_active, parse_args

NOISE = 4


def ring(generator: torch.Generator, n: int) -> torch.Tensor:
    angle = torch.randint(0, 6, (n,), generator=generator).float() * (2 * math.pi / 6)
    return torch.stack([angle.cos(), angle.sin()], dim=1) * 2 + 0.05 * torch.randn(n, 2, generator=generator)


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    netG = nn.Sequential(nn.Linear(NOISE, 32), nn.ReLU(), nn.Linear(32, 2))
    netD = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))
    ones, zeros = torch.ones(64, 1), torch.zeros(64, 1)

    for step in range(args.steps):
        real = ring(generator, 64)
        if not bug_active(args, step):
            netD.zero_grad()
        fake = netG(torch.randn(64, NOISE, generator=generator))
        errD = F.binary_cross_entropy_with_logits(netD(real), ones) + \
            F.binary_cross_entropy_with_logits(netD(fake.detach()), zeros)
        errD.backward()
        optimizerD.step()

        netG.zero_grad()
        errG = F.binary_cross_entropy_with_logits(netD(fake), ones)
        errG.backward()
        optimizerG.step()
        print(f"step {step} errD {errD.item():.3f} errG {errG.item():.3f} "
              f"D_grad {netD[0].weight.grad.norm().item():.3f}", flush=True)


if __name__ == "__main__":
    main()
