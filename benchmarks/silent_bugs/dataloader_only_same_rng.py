"""A DataLoader-only program whose workers all draw the same "random" augmentation
(Stack Overflow 67180955 and the numerous "identical augmentations across workers"
reports; the dataset owns a numpy ``Generator``, which PyTorch does not reseed per worker).

The program precomputes an augmented copy of a dataset with two DataLoader workers — a
preprocessing job, no model, no training step. Its healthy twin reseeds the dataset's
generator in ``worker_init_fn``; with ``--bug`` the loader is built without it and both
workers emit the same noise sequence. The whole run is the setup window (``--onset`` is
ignored; ``--steps`` is the number of batches read).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from _common import parse_args


class JitteredSignals(Dataset):
    def __init__(self, size: int, seed: int) -> None:
        self.size = size
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        clean = np.sin(np.linspace(0, 2 * np.pi, 16) * (1 + index % 4)).astype(np.float32)
        return torch.from_numpy(clean + self.rng.normal(0.0, 0.2, 16).astype(np.float32))


def reseed_dataset_rng(worker_id: int) -> None:
    info = get_worker_info()
    info.dataset.rng = np.random.default_rng(info.seed)


def main() -> None:
    args = parse_args(__doc__)
    loader = DataLoader(
        JitteredSignals(8 * 2 * args.steps, args.seed), batch_size=8, num_workers=2,
        worker_init_fn=None if args.bug else reseed_dataset_rng,
        generator=torch.Generator().manual_seed(args.seed),
    )
    batches = []
    for index, batch in enumerate(loader):
        if index >= args.steps:
            break
        batches.append(batch)
    # batches 2k and 2k+1 come from the two workers and hold the same clean signals, so
    # equal batches mean the workers drew the same noise
    repeats = sum(torch.equal(batches[i], batches[i + 1]) for i in range(0, len(batches) - 1, 2))
    print(f"augmented {sum(len(b) for b in batches)} samples; worker pairs with identical noise: {repeats}", flush=True)


if __name__ == "__main__":
    main()
