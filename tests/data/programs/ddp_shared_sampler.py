"""Two gloo ranks under DDP drawing their batches from a DataLoader.

Epoch 0 uses a ``DistributedSampler``: each rank trains on its own shard.  From epoch 1
on, the loader is rebuilt with a plain ``RandomSampler`` whose generator is seeded alike
on every rank (``same-batches``), so both replicas draw the same batches, the bug of a
sampler that does not split the data by rank (omnidata-paper-code-dump#5); the healthy
shape keeps the ``DistributedSampler`` (``sharded``).  Prints ``ONSET step K`` for the
first optimizer step trained on shared batches.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, TensorDataset

EPOCHS, BATCH = 3, 8


def _loader(data: TensorDataset, epoch: int, shared: bool) -> DataLoader:
    if epoch > 0 and shared:
        return DataLoader(data, batch_size=BATCH, sampler=RandomSampler(
            data, num_samples=len(data) // 2, generator=torch.Generator().manual_seed(epoch)))
    sampler = DistributedSampler(data, shuffle=True, seed=3)
    sampler.set_epoch(epoch)
    return DataLoader(data, batch_size=BATCH, sampler=sampler)


def main() -> None:
    shared = sys.argv[1] == "same-batches"
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 6), torch.randn(64, 1))
    model = DistributedDataParallel(nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    step = 0
    for epoch in range(EPOCHS):
        for inputs, targets in _loader(data, epoch, shared):
            if shared and epoch == 1 and step == len(data) // (2 * BATCH) and dist.get_rank() == 0:
                print(f"ONSET step {step}", flush=True)
            optimizer.zero_grad()
            nn.functional.mse_loss(model(inputs), targets).backward()
            optimizer.step()
            step += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
