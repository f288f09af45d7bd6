"""``DistributedSampler.set_epoch`` not called (PyTorch issue 31771, "DistributedSampler
can't shuffle the dataset": every epoch samples the data in the same order).

Root-cause class: data order not reshuffled across epochs. Each rank reads its shard
through a ``DistributedSampler(shuffle=True)``; the sampler seeds its shuffle with the
epoch number it was last given. From the onset the loop no longer calls
``sampler.set_epoch(epoch)`` (it moved into a branch that is no longer taken), so every
later epoch replays the previous epoch's order and batch composition exactly.

Launch: ``python -m torch.distributed.run --standalone --nproc-per-node 2 distributed_sampler_no_set_epoch.py``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from _common import bug_active, init_gloo, parse_args, shutdown_gloo


def main() -> None:
    args = parse_args(__doc__)
    rank, world = init_gloo()
    generator = torch.Generator().manual_seed(args.seed)
    x = torch.randn(64, 8, generator=generator)
    y = (x[:, 0] > 0).long()
    sampler = DistributedSampler(TensorDataset(x, y), num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, sampler=sampler)  # one batch per epoch per rank
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    model.train()
    for epoch in range(args.steps):
        if not bug_active(args, epoch):
            sampler.set_epoch(epoch)
        for inputs, labels in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(inputs), labels)
            loss.backward()
            optimizer.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f} first_index {next(iter(sampler))}", flush=True)
    shutdown_gloo()


if __name__ == "__main__":
    main()
