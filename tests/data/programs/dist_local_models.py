"""Two gloo ranks without DDP, in one of three shapes.

``federated`` (FedAvg, McMahan et al. 2017): each rank trains its own copy of the
global model on its own data for a round of local steps, then the ranks average their
parameters with ``all_reduce`` after the round's last step; rank 1 holds more data, so
it takes two more local steps per round and ends its run later.  The ranks are not
replicas between averagings, on purpose.  ``manual-dp``: a hand-written data-parallel
loop that averages gradients between the backward and the step, healthy.
``manual-dp --skip-reduce K``: the same loop whose rank 1 stops reducing from step K
on, so the replicas drift apart (the bug cross-rank rules are for).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch import nn

ROUNDS, LOCAL_STEPS = 3, 4


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


def _loss(model: nn.Module, data: torch.Generator) -> torch.Tensor:
    inputs, targets = torch.randn(16, 8, generator=data), torch.randn(16, 1, generator=data)
    return nn.functional.mse_loss(model(inputs), targets)


def federated(rank: int, world: int) -> None:
    global_model = _model()
    data = torch.Generator().manual_seed(rank + 10)
    for _ in range(ROUNDS):
        local = _model()
        local.load_state_dict(global_model.state_dict())
        optimizer = torch.optim.SGD(local.parameters(), lr=0.05)
        for _ in range(LOCAL_STEPS + 2 * rank):
            optimizer.zero_grad()
            _loss(local, data).backward()
            optimizer.step()
        with torch.no_grad():
            for averaged, trained in zip(global_model.parameters(), local.parameters()):
                summed = trained.detach().clone()
                dist.all_reduce(summed)
                averaged.copy_(summed / world)


def manual_dp(rank: int, world: int, skip_from: int | None) -> None:
    """From ``skip_from`` on, rank 1 skips its reduction and rank 0 reduces through a
    group of its own, so no collective waits for a partner."""
    alone = dist.new_group([0])
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(rank + 10)
    for step in range(ROUNDS * LOCAL_STEPS):
        optimizer.zero_grad()
        _loss(model, data).backward()
        for param in model.parameters():
            if skip_from is None or step < skip_from:
                dist.all_reduce(param.grad)
                param.grad /= world
            elif rank == 0:
                dist.all_reduce(param.grad, group=alone)
        optimizer.step()


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        if sys.argv[1] == "federated":
            federated(rank, world)
        else:
            manual_dp(rank, world, int(sys.argv[3]) if "--skip-reduce" in sys.argv else None)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
