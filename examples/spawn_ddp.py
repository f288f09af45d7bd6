"""Two-rank data-parallel training started with ``torch.multiprocessing.spawn``.

The launcher sets no RANK/WORLD_SIZE environment; each spawned worker learns its rank
only from ``init_process_group``, the way many research codebases start DDP jobs.

    python examples/spawn_ddp.py --steps 10
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ddp_gloo import parse_args, train  # noqa: E402


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def worker(rank: int, world_size: int, master_port: int, args: argparse.Namespace) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{master_port}", rank=rank, world_size=world_size
    )
    try:
        loss = train(rank, world_size, args)
        print(f"spawn_ddp rank {rank}/{world_size}: {args.steps} steps, final loss {loss:.4f}")
        dist.barrier()  # leave together: a rank tearing gloo down mid-exchange aborts its peer
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser_args = parse_args()
    world_size = int(os.environ.get("SPAWN_WORLD_SIZE", "2"))
    mp.spawn(worker, args=(world_size, free_loopback_port(), parser_args), nprocs=world_size, join=True)


if __name__ == "__main__":
    main()
