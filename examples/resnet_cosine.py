"""A small residual CNN with BatchNorm and Dropout, SGD + cosine-annealed learning rate,
label smoothing, and a validation pass after every "epoch" of a few steps."""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.nn import functional as F


class ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class SmallResNet(nn.Module):
    def __init__(self, classes: int = 5) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 12, 3, padding=1, bias=False), nn.BatchNorm2d(12), nn.ReLU())
        self.blocks = nn.Sequential(ResidualBlock(12), ResidualBlock(12))
        self.classifier = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.3), nn.Linear(12, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.blocks(self.stem(x)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epoch-steps", type=int, default=5)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    prototypes = torch.randn(5, 3, 8, 8, generator=generator)
    val_labels = torch.randint(0, 5, (40,), generator=generator)
    val_images = prototypes[val_labels] + torch.randn(40, 3, 8, 8, generator=generator)
    model = SmallResNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, args.steps))

    for step in range(args.steps):
        model.train()
        labels = torch.randint(0, 5, (16,), generator=generator)
        images = prototypes[labels] + torch.randn(16, 3, 8, 8, generator=generator)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels, label_smoothing=0.1)
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % args.epoch_steps == args.epoch_steps - 1:
            model.eval()
            with torch.no_grad():
                accuracy = (model(val_images).argmax(dim=1) == val_labels).float().mean().item()
            print(f"step {step} loss {loss.item():.4f} val_acc {accuracy:.3f}", flush=True)


if __name__ == "__main__":
    main()
