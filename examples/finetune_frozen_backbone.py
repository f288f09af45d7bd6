"""Fine-tuning with a frozen backbone: a "pretrained" conv feature extractor has
``requires_grad_(False)`` and stays in eval mode (frozen BatchNorm statistics); only a
new classification head is optimised (SGD), and only its parameters are given to the
optimizer. At ``--unfreeze-at`` the backbone is unfrozen and joins the optimizer as a
second parameter group with a smaller learning rate (gradual unfreezing, as in ULMFiT-style
fine-tuning): the set of optimised parameters legitimately changes mid-run."""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.nn import functional as F


def backbone() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
    )


class FineTuned(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = backbone()
        self.head = nn.Linear(16, 4)

    def train(self, mode: bool = True) -> "FineTuned":
        super().train(mode)
        self.backbone.eval()  # frozen statistics, whatever mode the wrapper is in
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--unfreeze-at", type=int, default=3, help="step at which the backbone joins training")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    model = FineTuned()
    model.backbone.requires_grad_(False)
    optimizer = torch.optim.SGD(model.head.parameters(), lr=0.05, momentum=0.9)
    prototypes = torch.randn(4, 3, 8, 8, generator=generator)

    model.train()
    for step in range(args.steps):
        if step == args.unfreeze_at:
            model.backbone.requires_grad_(True)
            optimizer.add_param_group({"params": list(model.backbone.parameters()), "lr": 0.005})
        labels = torch.randint(0, 4, (16,), generator=generator)
        images = prototypes[labels] + 0.5 * torch.randn(16, 3, 8, 8, generator=generator)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        if step % 5 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
