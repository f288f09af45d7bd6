"""Point-cloud classification with random rotation and jitter drawn from a dataset-owned RNG.

Modelled on: fxia22/pointnet.pytorch ``train_classification.py`` (a shared per-point
MLP, a max-pool over points, a classifier head with dropout; Adam with a ``StepLR``
stepped once per epoch; augmentation by a random rotation about the up axis plus
Gaussian jitter in the dataset's ``__getitem__``), with the per-worker reseeding
recipe of NumPy's documentation (``SeedSequence`` spawned from the worker's torch seed).
Habits reproduced: the dataset owns a ``numpy.random.Generator``; ``worker_init_fn``
gives every worker its own stream; the DataLoader starts fresh workers each epoch; an
evaluation pass with accuracy at each epoch's end under ``torch.no_grad``.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

POINTS, CLASSES = 64, 3


class SyntheticShapes(Dataset):
    """Point samples of a sphere, a cube surface or a cylinder, fixed per index."""

    def __init__(self, length: int, seed: int, augment: bool) -> None:
        self.length = length
        self.seed = seed
        self.augment = augment
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self.length

    def _shape(self, index: int) -> tuple[np.ndarray, int]:
        source = np.random.default_rng(self.seed * 1000 + index)
        label = index % CLASSES
        if label == 0:
            points = source.normal(size=(POINTS, 3))
            points /= np.linalg.norm(points, axis=1, keepdims=True)
        elif label == 1:
            points = source.uniform(-1, 1, size=(POINTS, 3))
            face = source.integers(0, 3, size=POINTS)
            points[np.arange(POINTS), face] = np.sign(points[np.arange(POINTS), face])
        else:
            angle = source.uniform(0, 2 * np.pi, size=POINTS)
            points = np.stack([np.cos(angle), source.uniform(-1, 1, size=POINTS), np.sin(angle)], axis=1)
        return points.astype(np.float32), label

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        points, label = self._shape(index)
        if self.augment:
            theta = self.rng.uniform(0, 2 * np.pi)
            rotation = np.array([[np.cos(theta), 0, -np.sin(theta)], [0, 1, 0], [np.sin(theta), 0, np.cos(theta)]],
                                dtype=np.float32)
            points = points @ rotation + self.rng.normal(0, 0.02, size=points.shape).astype(np.float32)
        return torch.from_numpy(points.T.copy()), label


def seed_worker(worker_id: int) -> None:
    info = torch.utils.data.get_worker_info()
    info.dataset.rng = np.random.default_rng(np.random.SeedSequence(torch.initial_seed() % 2**63))


class PointNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(3, 32, 1), nn.BatchNorm1d(32), nn.ReLU(),
            nn.Conv1d(32, 64, 1), nn.BatchNorm1d(64), nn.ReLU(),
        )
        self.head = nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.3),
                                  nn.Linear(32, CLASSES))

    def forward(self, points: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.head(self.features(points).max(dim=2).values), dim=1)


def evaluate(model: nn.Module, loader: DataLoader) -> float:
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for points, labels in loader:
            correct += int((model(points).argmax(1) == labels).sum())
            total += len(labels)
    model.train()
    return correct / max(total, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epoch-batches", type=int, default=3, help="batches per (short) epoch")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    train_loader = DataLoader(
        SyntheticShapes(12 * args.epoch_batches, args.seed, augment=True), batch_size=12, shuffle=True,
        num_workers=args.workers, worker_init_fn=seed_worker, drop_last=True,
        generator=torch.Generator().manual_seed(args.seed),
    )
    test_loader = DataLoader(SyntheticShapes(24, args.seed + 5, augment=False), batch_size=12)
    model = PointNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999))
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.5)

    model.train()
    step = epoch = 0
    while step < args.steps:
        for points, labels in train_loader:
            optimizer.zero_grad()
            loss = F.nll_loss(model(points), labels)
            loss.backward()
            optimizer.step()
            step += 1
            if step >= args.steps:
                break
        scheduler.step()
        epoch += 1
        print(f"epoch {epoch} step {step} loss {loss.item():.4f} test_acc {evaluate(model, test_loader):.3f}",
              flush=True)


if __name__ == "__main__":
    main()
