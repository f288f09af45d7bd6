"""Gradients clipped while still multiplied by the AMP loss scale (milesial/Pytorch-UNet
issue 468, "Gradients are clipped before the unscaling"; fixed in pull request 470).

Root-cause class: AMP gradient clipping on scaled gradients. With a ``GradScaler`` the
gradients after ``backward`` are multiplied by the loss scale (65536 here). From the onset
``scaler.unscale_(optimizer)`` is dropped before ``clip_grad_norm_``: the clip sees a norm
tens of thousands of times too large, cuts the gradients to norm 1 *before* they are
unscaled, and ``scaler.step`` then divides them by the scale — every update is ~1e-5 of
what it should be. Training stalls with no error and no skipped step.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import bug_active, parse_args

MAX_NORM = 1.0


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    weights = torch.randn(10, 1, generator=generator)

    model.train()
    for step in range(args.steps):
        x = torch.randn(32, 10, generator=generator)
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            prediction = model(x)
        loss = F.mse_loss(prediction.float(), x @ weights)
        scaler.scale(loss).backward()
        if not bug_active(args, step):
            scaler.unscale_(optimizer)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        scaler.step(optimizer)
        scaler.update()
        print(f"step {step} loss {loss.item():.4f} clipped_from {norm.item():.3e}", flush=True)


if __name__ == "__main__":
    main()
