"""1-D signal classification whose dataset owns its augmentation RNGs.

Augmentation (time shift, gain, additive noise) draws from a ``numpy.random.Generator``
and a ``random.Random`` that the dataset object owns, as many audio and vision codebases
do. DataLoader workers receive a copy of the dataset, so ``worker_init_fn`` reseeds both
from the worker's own seed: every worker draws a different augmentation stream.
"""

from __future__ import annotations

import argparse
import random

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, get_worker_info


class ToneDataset(Dataset):
    """Class k is a sine burst at frequency k+1 somewhere in a 64-sample window."""

    def __init__(self, size: int, seed: int) -> None:
        self.size = size
        self.labels = np.random.default_rng(seed).integers(0, 4, size)
        self.noise_rng = np.random.default_rng(seed + 1)
        self.shift_rng = random.Random(seed + 2)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        label = int(self.labels[index])
        t = np.linspace(0.0, 1.0, 64, dtype=np.float32)
        signal = np.sin(2 * np.pi * (label + 1) * 4 * t).astype(np.float32)
        signal = np.roll(signal, self.shift_rng.randint(-8, 8))
        signal *= self.noise_rng.uniform(0.7, 1.3)
        signal += self.noise_rng.normal(0.0, 0.1, signal.shape).astype(np.float32)
        return torch.from_numpy(signal).unsqueeze(0), label


def reseed_worker_rngs(worker_id: int) -> None:
    info = get_worker_info()
    info.dataset.noise_rng = np.random.default_rng(info.seed % 2**32)
    info.dataset.shift_rng = random.Random(info.seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epoch-batches", type=int, default=3, help="batches per epoch (workers restart each epoch)")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    loader = DataLoader(
        ToneDataset(16 * args.epoch_batches, args.seed), batch_size=16, shuffle=True,
        num_workers=args.workers, worker_init_fn=reseed_worker_rngs,
        generator=torch.Generator().manual_seed(args.seed),
    )
    model = nn.Sequential(
        nn.Conv1d(1, 8, 5, padding=2), nn.ReLU(), nn.AdaptiveMaxPool1d(8), nn.Flatten(), nn.Linear(64, 4)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)

    model.train()
    step = 0
    while step < args.steps:
        for signals, labels in loader:  # a new epoch starts fresh worker processes
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(signals), labels)
            loss.backward()
            optimizer.step()
            if step % 5 == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
            step += 1
            if step >= args.steps:
                break


if __name__ == "__main__":
    main()
