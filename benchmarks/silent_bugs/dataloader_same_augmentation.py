"""DataLoader workers repeating the same random augmentation (Stack Overflow 67180955).

The dataset draws its augmentation from numpy's global RNG. Worker processes inherit the
parent's numpy state, so unless each worker reseeds numpy (``worker_init_fn``) every
worker produces the *same* sequence of "random" augmentations. From the onset the
pipeline switches to a stronger-augmentation loader that was built without the
``worker_init_fn``: batches from the two workers carry identical noise.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

from _common import bug_active, parse_args


class NoisyBars(Dataset):
    def __init__(self, size: int, noise: float) -> None:
        self.size, self.noise = size, noise

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        label = index % 3
        image = np.zeros((1, 8, 8), dtype=np.float32)
        image[0, 1 + 3 * label] = 1.0
        image += np.random.normal(0.0, self.noise, image.shape).astype(np.float32)
        return torch.from_numpy(image), label


def reseed_numpy(worker_id: int) -> None:
    np.random.seed(torch.initial_seed() % 2**32)


def make_loader(noise: float, seed: int, reseed: bool) -> DataLoader:
    return DataLoader(
        NoisyBars(16 * 64, noise), batch_size=16, shuffle=False, num_workers=2,
        worker_init_fn=reseed_numpy if reseed else None,
        generator=torch.Generator().manual_seed(seed),
    )


def main() -> None:
    args = parse_args(__doc__)
    np.random.seed(args.seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    batches = iter(make_loader(0.1, args.seed, reseed=True))
    model.train()
    for step in range(args.steps):
        if step == args.onset:  # curriculum: switch to stronger augmentation
            batches = iter(make_loader(0.3, args.seed, reseed=not bug_active(args, step)))
        images, labels = next(batches)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f} noise_digest {float(images[0].sum()):.4f}", flush=True)


if __name__ == "__main__":
    main()
