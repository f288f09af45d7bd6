"""Backbone features detached from the graph (queenie88/A-GCN issue 4: a ``.detach()`` left
on a tensor the loss depends on, so the layers that produced it never receive gradients).

Root-cause class: computation graph cut by ``detach``. From the onset the model's forward
detaches the backbone's features before the head (a change meant to stop gradients into
a logging branch). The optimizer still holds every parameter and the head keeps learning,
so the loss still falls; the backbone silently stops training.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import bug_active, parse_args


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU())
        self.head = nn.Linear(16, 3)
        self.detach_features = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.backbone(x)
        if self.detach_features:
            features = features.detach()
        return self.head(features)


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    centres = torch.randn(3, 12, generator=generator) * 2

    model.train()
    for step in range(args.steps):
        model.detach_features = bug_active(args, step)
        labels = torch.randint(0, 3, (32,), generator=generator)
        x = centres[labels] + torch.randn(32, 12, generator=generator)
        before = model.backbone[0].weight.detach().clone()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), labels)
        loss.backward()
        optimizer.step()
        moved = (model.backbone[0].weight - before).abs().max().item()
        print(f"step {step} loss {loss.item():.4f} backbone_update {moved:.2e}", flush=True)


if __name__ == "__main__":
    main()
