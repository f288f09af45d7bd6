"""Mixed-precision training on CPU: forward under ``torch.autocast("cpu", dtype=bfloat16)``,
fp32 master weights, loss computed in fp32, SGD with Nesterov momentum.

The reference for autocast invariants: inside the context, matmul-heavy modules return
bf16 while their parameters stay fp32."""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.nn import functional as F


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    centres = torch.randn(5, 20, generator=generator) * 2
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)

    model.train()
    for step in range(args.steps):
        labels = torch.randint(0, 5, (64,), generator=generator)
        inputs = centres[labels] + torch.randn(64, 20, generator=generator)
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(inputs)
        loss = F.cross_entropy(logits.float(), labels)
        loss.backward()
        optimizer.step()
        if step % 5 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
