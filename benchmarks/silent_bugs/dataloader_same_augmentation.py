"""DataLoader workers repeating the same random augmentation (Stack Overflow 67180955).

The dataset draws its augmentation noise from a numpy ``Generator`` it owns. Worker
processes receive a *copy* of the dataset, RNG state included, so unless each worker
reseeds that generator (``worker_init_fn``) every worker produces the same sequence of
"random" augmentations. (PyTorch reseeds numpy's *global* RNG per worker since 1.9; a
dataset-owned generator is the form of this bug that survives.) From the onset the
pipeline switches to a stronger-augmentation loader that was built without the
``worker_init_fn``: batches from the two workers carry identical noise.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, get_worker_info

from _common import bug_active, parse_args


class NoisyBars(Dataset):
    def __init__(self, size: int, noise: float, seed: int) -> None:
        self.size, self.noise = size, noise
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        label = index % 3
        image = np.zeros((1, 8, 8), dtype=np.float32)
        image[0, 1 + 3 * label] = 1.0
        image += self.rng.normal(0.0, self.noise, image.shape).astype(np.float32)
        return torch.from_numpy(image), label


def reseed_dataset_rng(worker_id: int) -> None:
    info = get_worker_info()
    info.dataset.rng = np.random.default_rng(info.seed)


def make_loader(noise: float, seed: int, reseed: bool) -> DataLoader:
    return DataLoader(
        NoisyBars(16 * 64, noise, seed), batch_size=16, shuffle=False, num_workers=2,
        worker_init_fn=reseed_dataset_rng if reseed else None,
        generator=torch.Generator().manual_seed(seed),
    )


def main() -> None:
    args = parse_args(__doc__)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    batches = iter(make_loader(0.1, args.seed, reseed=True))
    previous_noise = None
    model.train()
    for step in range(args.steps):
        if step == args.onset:  # curriculum: switch to stronger augmentation
            batches = iter(make_loader(0.3, args.seed, reseed=not bug_active(args, step)))
            previous_noise = None
        images, labels = next(batches)
        noise = images[:, 0].clone()
        noise[torch.arange(16), 1 + 3 * labels] -= 1.0  # remove the signal, keep the augmentation
        repeated = previous_noise is not None and torch.allclose(noise, previous_noise, atol=1e-5)
        previous_noise = noise
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f} same_noise_as_previous_batch {repeated}", flush=True)


if __name__ == "__main__":
    main()
