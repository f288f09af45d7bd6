"""A ``torch.compile``d model under DistributedDataParallel whose replicas drift because
gradient synchronisation is skipped (PyTorch forum and issue reports of gradient
accumulation with ``no_sync()`` whose "sync on the last micro-batch" condition is never
met, so ranks step on their local gradients only).

The loop accumulates two micro-batches per step and is meant to run the first under
``model.no_sync()``. From the onset an off-by-one in the accumulation counter puts every
micro-batch under ``no_sync()``: no all-reduce runs, each rank applies its own shard's
gradients and the replicas silently diverge. The model is compiled with
``torch.compile`` (``--backend``, default ``aot_eager`` to keep the run to seconds on CPU;
``inductor`` exercises the same path with generated kernels).

Launch: ``python -m torch.distributed.run --standalone --nproc-per-node 2 compiled_ddp_drift.py``.
"""

from __future__ import annotations

import contextlib
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

from _common import bug_active, init_gloo, parse_args, shard_generator, shutdown_gloo

MICRO_BATCHES = 2


def backend_from_argv() -> str:
    """``--backend NAME`` is read before the shared parser, which knows only the common flags."""
    if "--backend" in sys.argv:
        at = sys.argv.index("--backend")
        name = sys.argv[at + 1]
        del sys.argv[at:at + 2]
        return name
    return "aot_eager"


def main() -> None:
    backend = backend_from_argv()
    args = parse_args(__doc__)
    rank, world = init_gloo()
    data = shard_generator(args.seed, rank)
    target = torch.randn(8, 2, generator=torch.Generator().manual_seed(args.seed))
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
    compiled = torch.compile(model, backend=backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    compiled.train()
    for step in range(args.steps):
        optimizer.zero_grad()
        last = MICRO_BATCHES if bug_active(args, step) else MICRO_BATCHES - 1  # the off-by-one
        for micro in range(MICRO_BATCHES):
            sync = micro == last
            with contextlib.nullcontext() if sync else model.no_sync():
                x = torch.randn(16, 8, generator=data)
                loss = F.mse_loss(compiled(x), x @ target) / MICRO_BATCHES
                loss.backward()
        optimizer.step()
        weight = model.module[0].weight.detach().clone()
        gathered = [torch.empty_like(weight) for _ in range(world)]
        dist.all_gather(gathered, weight)
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f} replica_gap {(gathered[0] - gathered[-1]).abs().max().item():.2e}",
                  flush=True)
    shutdown_gloo()


if __name__ == "__main__":
    main()
