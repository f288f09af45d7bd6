"""Calling the raw module instead of the DDP wrapper (the "DDP out of sync" blog case).

From the onset the training loop calls ``model.module(x)`` — e.g. to reach a custom
method — instead of ``model(x)``. The forward bypasses DDP, no gradient all-reduce is
registered for the backward, each rank steps on its own gradients and the replicas
silently drift apart.

Launch: ``python -m torch.distributed.run --standalone --nproc-per-node 2 ddp_raw_module.py``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

from _common import bug_active, init_gloo, parse_args, shutdown_gloo, shard_generator


def main() -> None:
    args = parse_args(__doc__)
    rank, world = init_gloo()
    data = shard_generator(args.seed, rank)
    target = torch.randn(8, 2, generator=torch.Generator().manual_seed(args.seed))
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    model.train()
    for step in range(args.steps):
        x = torch.randn(16, 8, generator=data)
        forward = model.module if bug_active(args, step) else model
        optimizer.zero_grad()
        loss = F.mse_loss(forward(x), x @ target)
        loss.backward()
        optimizer.step()
        weight = model.module[0].weight.detach().clone()
        gathered = [torch.empty_like(weight) for _ in range(world)]
        dist.all_gather(gathered, weight)
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f} replica_gap {(gathered[0] - gathered[-1]).abs().max().item():.2e}", flush=True)
    shutdown_gloo()


if __name__ == "__main__":
    main()
