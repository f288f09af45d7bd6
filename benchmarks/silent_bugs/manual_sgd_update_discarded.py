"""A hand-written update that rebinds a name instead of writing the parameter (a mistake
reported on the PyTorch forum as "my parameters do not change when I update them by hand":
``p = p - lr * p.grad`` inside ``torch.no_grad()`` builds a new tensor and drops it).

The program trains with its own SGD step (``p.sub_(lr * p.grad)`` under ``no_grad``). From
the onset a "cleaned-up" version of the update is used that rebinds the loop variable, so
forward and backward keep running, gradients keep flowing and nothing is ever updated.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import bug_active, parse_args

LR = 0.1


def sgd_update(params: list[nn.Parameter], discard: bool) -> None:
    with torch.no_grad():
        for p in params:
            if discard:
                p = p - LR * p.grad  # noqa: PLW2901 — the bug: a new tensor, never stored
            else:
                p.sub_(LR * p.grad)
            p.grad = None


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    params = list(model.parameters())
    target = torch.randn(8, 1, generator=generator)

    model.train()
    for step in range(args.steps):
        x = torch.randn(32, 8, generator=generator)
        loss = F.mse_loss(model(x), x @ target)
        loss.backward()
        sgd_update(params, discard=bug_active(args, step))
        print(f"step {step} loss {loss.item():.4f} w0 {model[0].weight[0, 0].item():.5f}", flush=True)


if __name__ == "__main__":
    main()
