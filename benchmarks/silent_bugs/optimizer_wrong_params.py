"""Optimizer built over the wrong, frozen parameters (PyTorch forum 84911).

A two-phase fine-tuning schedule freezes the backbone at the onset and rebuilds the
optimizer for the head — but passes ``model.backbone.parameters()`` instead of
``model.head.parameters()``. The frozen parameters have no gradients, so every
``optimizer.step()`` from then on silently changes nothing.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import bug_active, parse_args


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.head = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    centres = torch.randn(3, 12, generator=generator) * 2

    model.train()
    for step in range(args.steps):
        if step == args.onset:  # phase 2: linear probing on a frozen backbone
            model.backbone.requires_grad_(False)
            trainable = model.backbone if bug_active(args, step) else model.head
            optimizer = torch.optim.SGD(trainable.parameters(), lr=0.05, momentum=0.9)
        labels = torch.randint(0, 3, (32,), generator=generator)
        x = centres[labels] + torch.randn(32, 12, generator=generator)
        before = model.head.weight.detach().clone()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), labels)
        loss.backward()
        optimizer.step()
        moved = (model.head.weight - before).abs().max().item()
        print(f"step {step} loss {loss.item():.4f} head_update {moved:.2e}", flush=True)


if __name__ == "__main__":
    main()
