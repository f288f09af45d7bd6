"""Command-line and setup shared by every reproduction, so that each script is only its bug.

Every reproduction is the same program twice: without ``--bug`` it is the healthy twin,
with ``--bug`` the silent error starts at iteration ``--onset`` (counted from 0; the
producer's step of iteration ``i`` is ``i + 1``, step 0 being setup). Before the onset
both runs are identical.
"""

from __future__ import annotations

import argparse
import os

import torch


def parse_args(description: str | None, default_onset: int = 3, default_steps: int = 8) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--bug", action="store_true", help="inject the silent error (default: healthy twin)")
    parser.add_argument("--onset", type=int, default=default_onset, help="first step at which the bug is active")
    parser.add_argument("--steps", type=int, default=default_steps, help="optimizer steps to run")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    return args


def bug_active(args: argparse.Namespace, step: int) -> bool:
    """True when the injected error is live at this step."""
    return args.bug and step >= args.onset


def init_gloo() -> tuple[int, int]:
    """Join the process group the launcher describes (torchrun sets the environment)."""
    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def shard_generator(seed: int, rank: int) -> torch.Generator:
    """A data stream that differs per rank (each rank reads its own shard)."""
    return torch.Generator().manual_seed(seed * 1000 + rank + 1)


def shutdown_gloo() -> None:
    """Leave the process group together: a rank tearing down while its peer is still in a
    collective makes gloo abort the peer, turning a healthy run into a crash."""
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
