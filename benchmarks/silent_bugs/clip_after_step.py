"""Gradient clipping called after ``optimizer.step()`` (VGraphRNN/VGRNN issue 4: "``clip_grad_norm``
is called after ``opt.step()`` so it isn't doing anything"; jongwook/onsets-and-frames
issue 24 is the same).

Root-cause class: gradient clipping misplaced. From the onset the clipping call is moved
below ``optimizer.step()``: it clips gradients that were already applied and are about to
be cleared. Every update is unclipped; nothing errors.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import bug_active, parse_args

MAX_NORM = 0.5


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    weights = torch.randn(10, 1, generator=generator) * 5

    model.train()
    for step in range(args.steps):
        x = torch.randn(32, 10, generator=generator)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), x @ weights)
        loss.backward()
        if bug_active(args, step):
            optimizer.step()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        else:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            optimizer.step()
        print(f"step {step} loss {loss.item():.4f} grad_norm {norm.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
