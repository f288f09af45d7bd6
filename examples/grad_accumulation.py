"""Gradient accumulation: each optimizer step sums the scaled gradients of several
micro-batches, so ``backward`` runs several times per step and ``zero_grad`` once.
Adagrad optimizer, a residual MLP with LayerNorm."""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.nn import functional as F


class ResidualMLP(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.inp = nn.Linear(10, width)
        self.blocks = nn.ModuleList(
            [nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU()) for _ in range(2)]
        )
        self.out = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        return self.out(h)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--accumulate", type=int, default=4)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    weights = torch.randn(10, 1, generator=generator)
    model = ResidualMLP()
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05)

    model.train()
    for step in range(args.steps):
        optimizer.zero_grad()
        total = 0.0
        for _ in range(args.accumulate):
            x = torch.randn(16, 10, generator=generator)
            loss = F.smooth_l1_loss(model(x), x @ weights) / args.accumulate
            loss.backward()
            total += loss.item()
        optimizer.step()
        if step % 5 == 0:
            print(f"step {step} loss {total:.4f}", flush=True)


if __name__ == "__main__":
    main()
