"""Two-rank DDP with torch's post-local SGD, as its documentation shows it: the
``post_localSGD_hook`` all-reduces gradients for the first ``WARMUP`` iterations, then
each rank steps on its own gradients and a ``PeriodicModelAverager`` averages the
parameters every ``PERIOD`` steps. Each rank draws its own data, so the replicas differ
between averagings on purpose. With ``--broken-average``, the same warm-up runs without
the hook: plain DDP whose replicas one rank then perturbs (a drift the checker must
still report)."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState, post_localSGD_hook
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.nn.parallel import DistributedDataParallel

WARMUP, PERIOD = 3, 4


def main() -> None:
    steps, local_sgd = int(sys.argv[1]), "--broken-average" not in sys.argv
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        torch.manual_seed(0)
        model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
        if local_sgd:
            subgroup, _ = dist.new_subgroups(group_size=1)
            model.register_comm_hook(PostLocalSGDState(process_group=None, subgroup=subgroup,
                                                       start_localSGD_iter=WARMUP), post_localSGD_hook)
        averager = PeriodicModelAverager(period=PERIOD, warmup_steps=WARMUP)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        data = torch.Generator().manual_seed(rank + 10)
        for step in range(steps):
            inputs, targets = torch.randn(16, 8, generator=data), torch.randn(16, 1, generator=data)
            optimizer.zero_grad()
            nn.functional.mse_loss(model(inputs), targets).backward()
            optimizer.step()
            if local_sgd:
                averager.average_parameters(model.parameters())
            elif step == WARMUP and rank == 1:
                with torch.no_grad():
                    next(model.parameters()).add_(0.01)  # one replica drifts
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
