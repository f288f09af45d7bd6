"""Backbone "frozen" with ``requires_grad=False`` while its BatchNorm keeps updating its
running statistics (PyTorch issue 86590: "after training, I end up with a model where all
batchnorm params have changed"; lightly-ai/lightly issue 1438 reports the same).

Root-cause class: frozen BatchNorm statistics still updated. At the onset the schedule
switches to linear probing: the backbone's parameters stop requiring gradients. The
healthy program also puts the backbone's BatchNorm layers in eval mode after every
``model.train()``; the buggy one does not, so the "frozen" backbone keeps drifting towards
the probing data's statistics and its features change under the head.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import parse_args


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(12, 32), nn.BatchNorm1d(32), nn.ReLU())
        self.head = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    centres = torch.randn(3, 12, generator=generator) * 2
    frozen = False

    for step in range(args.steps):
        if step == args.onset:  # linear probing: freeze the backbone, train the head only
            model.backbone.requires_grad_(False)
            optimizer = torch.optim.SGD(model.head.parameters(), lr=0.05, momentum=0.9)
            frozen = True
        model.train()
        if frozen and not args.bug:
            model.backbone.eval()
        labels = torch.randint(0, 3, (32,), generator=generator)
        x = centres[labels] + torch.randn(32, 12, generator=generator) + (2.0 if frozen else 0.0)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), labels)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f} bn_mean {model.backbone[1].running_mean.mean().item():.3f}", flush=True)


if __name__ == "__main__":
    main()
