"""Regression target of shape ``(N,)`` against predictions of shape ``(N, 1)`` (PyTorch issue
16045: ``MSELoss`` broadcasts the pair to ``(N, N)``; only a ``UserWarning`` was added,
pull request 18349).

Root-cause class: loss target broadcast. From the onset the data pipeline squeezes the
target column. ``F.mse_loss`` broadcasts and compares every prediction with every target:
the gradient pulls all predictions towards the batch mean and the model learns a constant.
"""

from __future__ import annotations

import warnings

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
    warnings.simplefilter("ignore", UserWarning)  # the one warning is lost in a busy log

    model.train()
    for step in range(args.steps):
        x = torch.randn(32, 10, generator=generator)
        target = x @ weights
        if bug_active(args, step):
            target = target.squeeze(1)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), target)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f} target_shape {tuple(target.shape)}", flush=True)


if __name__ == "__main__":
    main()
