"""Data-parallel training with ``DistributedDataParallel`` on the gloo backend.

Launch with ``python -m torch.distributed.run --standalone --nproc-per-node 2
examples/ddp_torchrun.py``. Every rank reads a different shard of the data; DDP's
gradient all-reduce keeps the replicas bit-identical, which is the invariant this
reference exists to teach."""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)  # identical initial replicas (DDP also broadcasts rank 0's)
    data_rng = torch.Generator().manual_seed(args.seed * 1000 + rank)
    target = torch.randn(12, 3, generator=torch.Generator().manual_seed(args.seed))

    model = DistributedDataParallel(nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 3)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

    model.train()
    for step in range(args.steps):
        x = torch.randn(16, 12, generator=data_rng)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), x @ target)
        loss.backward()
        optimizer.step()
        mean_loss = loss.detach().clone()  # the loss averaged over ranks, for logging
        dist.all_reduce(mean_loss, op=dist.ReduceOp.SUM)
        mean_loss /= world
        if rank == 0 and step % 5 == 0:
            print(f"step {step} loss {mean_loss.item():.4f} world {world}", flush=True)
    dist.barrier()  # leave together: a rank exiting mid-collective makes gloo abort its peer
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
