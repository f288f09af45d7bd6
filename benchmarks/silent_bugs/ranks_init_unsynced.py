"""Replicas initialised differently on each rank, with no broadcast (antoyang/TubeDETR
issue 15 and facebookresearch/detr issue 544: ``torch.manual_seed(seed + rank)`` before the
model is built; sparticlesteve/pytorch-benchmarks pull request 1: without DDP's initial
broadcast "the model does not converge at all").

Root-cause class: replicas initialised differently. Two ranks average gradients by hand
with ``all_reduce`` (no DDP wrapper, so nothing broadcasts parameters). The global generator is
re-seeded per rank after the model is built (for augmentation). At the onset the
fine-tuning phase replaces the head with a freshly initialised layer; the healthy program
broadcasts it from rank 0, the buggy one forgets. Each rank then applies identical averaged
gradients to a different head: the replicas never agree again.

Launch: ``python -m torch.distributed.run --standalone --nproc-per-node 2 ranks_init_unsynced.py``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from _common import init_gloo, parse_args, shard_generator, shutdown_gloo


def broadcast_parameters(module: nn.Module) -> None:
    for param in module.parameters():
        dist.broadcast(param.data, src=0)


def main() -> None:
    args = parse_args(__doc__)
    rank, world = init_gloo()
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(8, 24), nn.ReLU(), nn.Linear(24, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = shard_generator(args.seed, rank)
    torch.manual_seed(args.seed + rank)  # per-rank randomness for augmentation, as in DETR's main.py

    model.train()
    for step in range(args.steps):
        if step == args.onset:  # phase 2: a fresh head, drawn from the per-rank generator
            model[2] = nn.Linear(24, 2)
            if not args.bug:
                broadcast_parameters(model[2])
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(32, 8, generator=data)
        labels = (x[:, 0] - x[:, 1] > 0).long()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), labels)
        loss.backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)
            param.grad.div_(world)
        optimizer.step()
        weight = model[2].weight.detach().clone()
        gathered = [torch.empty_like(weight) for _ in range(world)]
        dist.all_gather(gathered, weight)
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f} replica_gap {(gathered[0] - gathered[-1]).abs().max().item():.2e}", flush=True)
    shutdown_gloo()


if __name__ == "__main__":
    main()
