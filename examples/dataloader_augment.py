"""Image classification fed by a ``DataLoader`` with two worker processes and random
augmentation (numpy-driven flips and crops). Each worker reseeds numpy from its torch
seed in ``worker_init_fn`` so the workers draw different augmentations."""

from __future__ import annotations

import argparse

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset


class ShapesDataset(Dataset):
    """Synthetic 12x12 images: class k has a bright bar in row/column k."""

    def __init__(self, size: int, seed: int) -> None:
        self.labels = np.random.default_rng(seed).integers(0, 4, size)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        label = int(self.labels[index])
        image = np.zeros((1, 12, 12), dtype=np.float32)
        image[0, 2 + 2 * label, :] = 1.0
        image += np.random.normal(0, 0.2, image.shape).astype(np.float32)  # augmentation noise
        if np.random.rand() < 0.5:
            image = image[:, :, ::-1].copy()
        shift = np.random.randint(-1, 2)
        image = np.roll(image, shift, axis=2)
        return torch.from_numpy(image), label


def seed_worker(worker_id: int) -> None:
    np.random.seed(torch.initial_seed() % 2**32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epoch-batches", type=int, default=4, help="batches per epoch (workers restart each epoch)")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    loader = DataLoader(
        ShapesDataset(args.epoch_batches * 16, args.seed), batch_size=16, shuffle=True, num_workers=args.workers,
        worker_init_fn=seed_worker, generator=torch.Generator().manual_seed(args.seed), persistent_workers=False,
    )
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(128, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    model.train()
    step = 0
    while step < args.steps:
        for images, labels in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            if step % 5 == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
            step += 1
            if step >= args.steps:
                break


if __name__ == "__main__":
    main()
