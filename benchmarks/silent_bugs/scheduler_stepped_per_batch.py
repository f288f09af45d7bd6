"""Epoch-based learning-rate schedule stepped once per batch (hazdzz/stgcn issue 18: the
``scheduler.step()`` inside the mini-batch loop "leads to the learning rate decreasing too
fast"; ivadomed/ivadomed pull request 55 fixes the same mistake).

Root-cause class: learning-rate schedule stepped at the wrong frequency. A ``StepLR``
meant to decay every 2 epochs is stepped in the batch loop from the onset (a refactor
moved it one indentation level in): with 2 batches per epoch the rate halves every other
batch instead of every other epoch and is near zero within a few epochs. Nothing errors; training just stops.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import bug_active, parse_args

BATCHES_PER_EPOCH = 2


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    weights = torch.randn(10, 1, generator=generator)

    model.train()
    for iteration in range(args.steps):
        x = torch.randn(32, 10, generator=generator)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), x @ weights)
        loss.backward()
        optimizer.step()
        end_of_epoch = (iteration + 1) % BATCHES_PER_EPOCH == 0
        if bug_active(args, iteration) or end_of_epoch:
            scheduler.step()
        print(f"iteration {iteration} loss {loss.item():.4f} lr {optimizer.param_groups[0]['lr']:.5f}", flush=True)


if __name__ == "__main__":
    main()
