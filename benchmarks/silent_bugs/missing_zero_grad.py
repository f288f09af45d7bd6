"""Missing ``optimizer.zero_grad()`` (Stack Overflow 60335387).

A refactor moves the ``zero_grad`` call behind a condition that is no longer met, so from
the onset gradients accumulate across steps: every update uses the sum of all previous
gradients. Nothing crashes; the loss just trains badly.
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
    for step in range(args.steps):
        x = torch.randn(32, 10, generator=generator)
        if not bug_active(args, step):
            optimizer.zero_grad()
        loss = F.mse_loss(model(x), x @ weights)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f} grad_norm {model[0].weight.grad.norm().item():.3f}", flush=True)


if __name__ == "__main__":
    main()
