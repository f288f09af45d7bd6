"""A small CNN with BatchNorm and Dropout, a DataLoader and a validation pass.

Exercises the stage switches that silent bugs hide behind: ``model.train()`` for the
training steps, ``model.eval()`` + ``torch.no_grad()`` for validation every
``--val-every`` steps.  ``--num-workers`` puts the data pipeline in DataLoader worker
processes with a random augmentation, the way real image pipelines do.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class NoisyShapes(Dataset):
    """Synthetic 1x12x12 images whose class is the quadrant holding a bright blob."""

    def __init__(self, size: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 4, (size,), generator=generator)
        self.base = torch.randn(size, 1, 12, 12, generator=generator) * 0.3

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.base[index].clone()
        label = int(self.labels[index])
        row, col = divmod(label, 2)
        image[:, row * 6 : row * 6 + 6, col * 6 : col * 6 + 6] += 1.0
        # Random augmentation drawn in the worker: flips of the noise only.
        image = image + 0.05 * torch.randn_like(image)
        return image, self.labels[index]


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.dropout = nn.Dropout(0.3)
        self.head = nn.Linear(16, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(self.features(images).flatten(1)))


def evaluate(model: nn.Module, loader: DataLoader) -> float:
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in loader:
            correct += int((model(images).argmax(dim=1) == labels).sum())
            total += len(labels)
    model.train()
    return correct / max(total, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--val-every", type=int, default=10)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    train_loader = DataLoader(
        NoisyShapes(size=max(args.steps * args.batch_size, 64), seed=args.seed),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.num_workers,
        drop_last=True,
    )
    val_loader = DataLoader(NoisyShapes(size=32, seed=args.seed + 1), batch_size=16)
    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    model.train()
    step = 0
    accuracy = float("nan")
    loss = torch.tensor(float("nan"))
    while step < args.steps:
        for images, labels in train_loader:
            optimizer.zero_grad()
            loss = loss_fn(model(images), labels)
            loss.backward()
            optimizer.step()
            step += 1
            if step % args.val_every == 0 or step == args.steps:
                accuracy = evaluate(model, val_loader)
            if step >= args.steps:
                break
    print(f"cnn_bn_dropout: {step} steps, final loss {loss.item():.4f}, val accuracy {accuracy:.2f}")


if __name__ == "__main__":
    main()
