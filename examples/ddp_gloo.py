"""Two-rank data-parallel training on CPU (gloo), launched with torchrun.

    python -m torch.distributed.run --nproc-per-node 2 examples/ddp_gloo.py --steps 10

Every rank sees different data; DistributedDataParallel averages the gradients, so
the replicas stay bit-identical.  ``--perturb-rank R --perturb-step K`` reproduces a
silent replica divergence: after step K, rank R quietly nudges one weight, and from
then on the replicas differ while the loss still looks healthy.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--perturb-rank", type=int, default=None, help="rank that silently diverges")
    parser.add_argument("--perturb-step", type=int, default=None, help="step after which it diverges")
    return parser.parse_args(argv)


def train(rank: int, world_size: int, args: argparse.Namespace) -> float:
    """The per-rank training loop; the process group must already be initialised."""
    torch.manual_seed(args.seed)  # same initial weights on every rank
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    ddp_model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    data_generator = torch.Generator().manual_seed(args.seed * 1000 + rank + 1)
    teacher = torch.randn(16, 4, generator=torch.Generator().manual_seed(args.seed))

    ddp_model.train()
    loss = torch.tensor(float("nan"))
    for step in range(1, args.steps + 1):
        inputs = torch.randn(args.batch_size, 16, generator=data_generator)
        targets = (inputs @ teacher).argmax(dim=1)
        optimizer.zero_grad()
        loss = loss_fn(ddp_model(inputs), targets)
        loss.backward()
        optimizer.step()
        if rank == args.perturb_rank and step == args.perturb_step:
            with torch.no_grad():
                model[0].weight[0, 0].add_(1e-3)
    return float(loss.item())


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    try:
        loss = train(rank, world_size, args)
        print(f"ddp_gloo rank {rank}/{world_size}: {args.steps} steps, final loss {loss:.4f}")
        dist.barrier()  # leave together: a rank tearing gloo down mid-exchange aborts its peer
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
