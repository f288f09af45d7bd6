"""Gradient clipping called before ``loss.backward()`` (Cranial-XIX/FAMO issue 4: "Why should
``clip_grad_norm_`` be before ``loss.backward()``?" — "thanks for catching this bug, it
should be after").

Root-cause class: gradient clipping misplaced. From the onset the clipping call sits
between ``zero_grad`` and ``backward``: it clips gradients that were just cleared, and the
fresh gradients reach ``optimizer.step()`` unclipped. With a loss that produces large
gradients the run becomes unstable with nothing reported.
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
        if bug_active(args, step):
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            loss.backward()
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f} applied_grad_norm {grad_norm.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
