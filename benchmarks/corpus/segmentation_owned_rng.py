"""Semantic segmentation with joint random crop/flip drawn from a dataset-owned RNG.

Modelled on: the torchvision segmentation reference recipe (pytorch/vision
references/segmentation: paired image/mask transforms, SGD with a polynomial learning-rate
decay, an epoch loop whose DataLoader starts fresh workers every epoch), with the
per-worker reseeding recipe of the
PyTorch DataLoader documentation ("Randomness in multi-process data loading").
Habits reproduced: the dataset owns a ``numpy.random.RandomState`` for its paired
augmentations and ``worker_init_fn`` reseeds it from ``torch.initial_seed()``; a
``LambdaLR`` poly schedule stepped per iteration; an evaluation pass with mean IoU every
few iterations under ``torch.inference_mode``.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

CLASSES, SIZE, CROP = 3, 24, 16


class BlobSegmentation(Dataset):
    """Images of a few coloured discs; the mask labels each pixel by disc colour."""

    def __init__(self, length: int, seed: int) -> None:
        self.length = length
        self.seed = seed
        self.rng = np.random.RandomState(seed)

    def __len__(self) -> int:
        return self.length

    def _scene(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        scene = np.random.RandomState(self.seed * 1000 + index)  # content fixed per index
        image = scene.normal(0.0, 0.1, (3, SIZE, SIZE)).astype(np.float32)
        mask = np.zeros((SIZE, SIZE), dtype=np.int64)
        yy, xx = np.mgrid[:SIZE, :SIZE]
        for label in (1, 2):
            cy, cx, r = scene.randint(4, SIZE - 4), scene.randint(4, SIZE - 4), scene.randint(3, 6)
            disc = (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
            mask[disc] = label
            image[label - 1][disc] += 1.0
        return image, mask

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image, mask = self._scene(index)
        top, left = self.rng.randint(0, SIZE - CROP + 1, size=2)
        image, mask = image[:, top:top + CROP, left:left + CROP], mask[top:top + CROP, left:left + CROP]
        if self.rng.rand() < 0.5:
            image, mask = image[:, :, ::-1], mask[:, ::-1]
        return torch.from_numpy(image.copy()), torch.from_numpy(mask.copy())


def seed_worker(worker_id: int) -> None:
    info = torch.utils.data.get_worker_info()
    info.dataset.rng = np.random.RandomState(torch.initial_seed() % 2**32)


class TinySegNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
            nn.Conv2d(16, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
        )
        self.classifier = nn.Conv2d(16, CLASSES, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.classifier(self.encoder(x))
        return F.interpolate(logits, size=x.shape[-2:], mode="bilinear", align_corners=False)


def mean_iou(model: nn.Module, loader: DataLoader) -> float:
    model.eval()
    intersection = torch.zeros(CLASSES)
    union = torch.zeros(CLASSES)
    with torch.inference_mode():
        for images, masks in loader:
            predicted = model(images).argmax(1)
            for label in range(CLASSES):
                p, t = predicted == label, masks == label
                intersection[label] += (p & t).sum()
                union[label] += (p | t).sum()
    model.train()
    return float((intersection / union.clamp(min=1)).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--epoch-batches", type=int, default=2, help="batches per (short) epoch")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    train_loader = DataLoader(
        BlobSegmentation(8 * args.epoch_batches, args.seed), batch_size=8, shuffle=True, num_workers=args.workers,
        worker_init_fn=seed_worker, drop_last=True,
        generator=torch.Generator().manual_seed(args.seed),
    )
    val_loader = DataLoader(BlobSegmentation(16, args.seed + 7), batch_size=8)
    model = TinySegNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda it: (1 - it / args.steps) ** 0.9)

    model.train()
    step = 0
    while step < args.steps:
        for images, masks in train_loader:  # each epoch starts its workers afresh
            loss = F.cross_entropy(model(images), masks)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            if step % args.eval_every == 0:
                print(f"step {step} loss {loss.item():.4f} mIoU {mean_iou(model, val_loader):.3f}", flush=True)
            if step >= args.steps:
                break


if __name__ == "__main__":
    main()
