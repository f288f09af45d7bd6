"""Stage freezing applied only inside ``train()`` (mmpretrain issue 702).

The backbone implements ``frozen_stages`` the way many vision backbones do: its
``_freeze_stages()`` (``requires_grad_(False)`` plus ``eval()`` on the frozen stages) runs
only from the ``train()`` override. At the onset the schedule sets
``backbone.frozen_stages = 1``; the healthy twin then calls ``model.train()``, the buggy
run does not (the model is already in training mode), so the stem silently keeps
training and its BatchNorm keeps updating statistics.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import bug_active, parse_args


class Backbone(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.frozen_stages = 0
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.stage1 = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())

    def _freeze_stages(self) -> None:
        if self.frozen_stages >= 1:
            self.stem.eval()
            self.stem.requires_grad_(False)

    def train(self, mode: bool = True) -> "Backbone":
        super().train(mode)
        self._freeze_stages()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.stage1(self.stem(x)))


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    backbone = Backbone()
    model = nn.Sequential(backbone, nn.Linear(8, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    prototypes = torch.randn(3, 3, 6, 6, generator=generator)

    model.train()
    for step in range(args.steps):
        if step == args.onset:
            backbone.frozen_stages = 1
            if not bug_active(args, step):
                model.train()
        labels = torch.randint(0, 3, (16,), generator=generator)
        images = prototypes[labels] + 0.5 * torch.randn(16, 3, 6, 6, generator=generator)
        stem_before = backbone.stem[0].weight.detach().clone()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f} stem_update {(backbone.stem[0].weight - stem_before).abs().max().item():.2e}", flush=True)


if __name__ == "__main__":
    main()
