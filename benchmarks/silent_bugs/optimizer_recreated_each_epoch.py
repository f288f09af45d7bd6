"""Optimizer re-created inside the training loop (gaohongkui/GlobalPointer_pytorch issue 7:
"why is the optimizer redefined every epoch?" — "this is a bug, not a trick").

Root-cause class: optimizer state reset. From the onset the optimizer is constructed at
the top of every epoch (one iteration per epoch here), so Adam's moment estimates and
step count restart each time: every update is a bias-corrected first step of size ~lr in
every coordinate, whatever the gradient history says.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import bug_active, parse_args


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    weights = torch.randn(10, 1, generator=generator)

    model.train()
    for epoch in range(args.steps):
        if bug_active(args, epoch):
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        x = torch.randn(32, 10, generator=generator)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), x @ weights)
        loss.backward()
        optimizer.step()
        steps_seen = optimizer.state[model[0].weight]["step"].item()
        print(f"epoch {epoch} loss {loss.item():.4f} adam_step {steps_seen:.0f}", flush=True)


if __name__ == "__main__":
    main()
