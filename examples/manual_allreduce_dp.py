"""Data parallelism by hand: each rank computes gradients on its shard, then averages
them with ``torch.distributed.all_reduce`` before a plain SGD step — the pattern of
custom trainers that do not use DDP (and the one silent network corruption hits).

Launch with ``python -m torch.distributed.run --standalone --nproc-per-node 2
examples/manual_allreduce_dp.py``."""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F


def average_gradients(model: nn.Module, world: int) -> None:
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
            param.grad.div_(world)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(6, 24), nn.Tanh(), nn.Linear(24, 2))
    for param in model.parameters():  # start from rank 0's replica
        dist.broadcast(param.data, src=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data_rng = torch.Generator().manual_seed(args.seed * 1000 + rank)

    model.train()
    for step in range(args.steps):
        x = torch.randn(32, 6, generator=data_rng)
        labels = (x[:, 0] * x[:, 1] > 0).long()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), labels)
        loss.backward()
        average_gradients(model, world)
        optimizer.step()
        if rank == 0 and step % 5 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.barrier()  # leave together: a rank exiting mid-collective makes gloo abort its peer
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
