"""Two-rank fully sharded training on CPU (FSDP2, ``fully_shard``, gloo), launched with torchrun.

    python -m torch.distributed.run --nproc-per-node 2 examples/fsdp2_gloo.py --steps 8

Each parameter is a DTensor: every rank holds one shard of it, so shards differ across
ranks by design and are not judged as replicas; their values and digests are those of
the local shard.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        torch.manual_seed(0)  # the same full model on every rank before sharding
        model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        data = torch.Generator().manual_seed(rank + 1)
        for _ in range(args.steps):
            inputs = torch.randn(8, 16, generator=data)
            targets = torch.randint(0, 4, (8,), generator=data)
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(inputs), targets).backward()
            optimizer.step()
        print(f"fsdp2_gloo rank {rank}: {args.steps} steps")
        dist.barrier()  # leave together: a rank tearing gloo down mid-exchange aborts its peer
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
