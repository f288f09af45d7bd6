"""Density estimation on 2-D toy data with an invertible residual network (spectral norm).

Modelled on: jhjacobsen/invertible-resnet and rtqichen/residual-flows, toy 2-D density
experiments (residual blocks ``x + g(x)`` whose linear layers carry
``torch.nn.utils.spectral_norm`` scaled by a coefficient below one, so each block is
invertible; the log-determinant of each block by a truncated power series with a
Hutchinson trace estimate; Adam with weight decay; a held-out negative log-likelihood
under ``torch.no_grad`` every few iterations).  Habits reproduced: spectral-normalised
layers first run in training mode (their power iteration warms up there), a per-step
fresh Hutchinson probe from the global RNG, and an evaluation in ``eval()`` mode
(spectral norm then reuses its last estimate).
"""

from __future__ import annotations

import argparse
import math

import torch
from torch import nn
from torch.nn.utils import spectral_norm

COEFF, TERMS = 0.9, 4


class InvertibleBlock(nn.Module):
    """``x + coeff * g(x)`` with a spectrally normalised ``g``: a contraction, so invertible."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.g = nn.Sequential(spectral_norm(nn.Linear(2, width)), nn.ELU(), spectral_norm(nn.Linear(width, 2)))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x.requires_grad_(True) if not x.requires_grad else x
        residual = COEFF * self.g(x)
        probe = torch.randn_like(x)
        vector, logdet = probe, torch.zeros(x.shape[0])
        for k in range(1, TERMS + 1):  # log det(I + J) = sum (-1)^(k+1) tr(J^k) / k
            vector = torch.autograd.grad(residual, x, vector, create_graph=self.training, retain_graph=True)[0]
            logdet = logdet + (-1) ** (k + 1) * (vector * probe).sum(dim=1) / k
        return x + residual, logdet


class ResidualFlow(nn.Module):
    def __init__(self, blocks: int = 4, width: int = 32) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(InvertibleBlock(width) for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Negative log-likelihood per sample under a standard normal base."""
        total = torch.zeros(x.shape[0])
        for block in self.blocks:
            x, logdet = block(x)
            total = total + logdet
        base = -0.5 * (x ** 2).sum(dim=1) - math.log(2 * math.pi)
        return -(base + total)


def two_moons(count: int, generator: torch.Generator) -> torch.Tensor:
    angle = torch.rand(count, generator=generator) * math.pi
    upper = torch.rand(count, generator=generator) < 0.5
    x = torch.where(upper, torch.cos(angle), 1 - torch.cos(angle))
    y = torch.where(upper, torch.sin(angle), 0.5 - torch.sin(angle))
    return torch.stack([x, y], dim=1) + 0.05 * torch.randn(count, 2, generator=generator)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=5)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    data = torch.Generator().manual_seed(args.seed)
    held_out = two_moons(128, torch.Generator().manual_seed(args.seed + 1))
    flow = ResidualFlow()
    optimizer = torch.optim.Adam(flow.parameters(), lr=1e-3, weight_decay=1e-5)

    flow.train()
    for step in range(1, args.steps + 1):
        optimizer.zero_grad()
        loss = flow(two_moons(64, data)).mean()
        loss.backward()
        optimizer.step()
        if step % args.eval_every == 0:
            flow.eval()
            with torch.enable_grad():  # the log-det estimate needs input gradients, not parameter updates
                nll = flow(held_out.clone()).mean().item()
            flow.train()
            print(f"step {step} train_nll {loss.item():.3f} test_nll {nll:.3f}", flush=True)


if __name__ == "__main__":
    main()
