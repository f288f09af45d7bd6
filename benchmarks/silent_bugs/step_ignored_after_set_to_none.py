"""An optimizer step silently ignored after gradients were set to None (PyTorch issue
115607: a compiled optimizer step specialised while ``.grad`` was None kept running the
no-op specialisation after gradients came back).

``PlannedSGD`` precomputes which parameters to update (a "plan", standing in for the
compiled kernel) and rebuilds it when gradients are reset. From the onset the loop uses
``zero_grad(set_to_none=True)``. The buggy optimizer rebuilds its plan eagerly inside
``zero_grad`` — when every ``.grad`` is None — so the plan is empty and each following
``step()`` silently updates nothing. The healthy twin rebuilds the plan lazily at the
next ``step()``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import bug_active, parse_args


class PlannedSGD(torch.optim.Optimizer):
    def __init__(self, params, lr: float) -> None:
        super().__init__(params, {"lr": lr})
        self.plan: list[tuple[torch.Tensor, float]] | None = None
        self.eager_replan = False

    def _build_plan(self) -> list[tuple[torch.Tensor, float]]:
        return [(p, group["lr"]) for group in self.param_groups for p in group["params"] if p.grad is not None]

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none=set_to_none)
        if set_to_none:
            self.plan = self._build_plan() if self.eager_replan else None

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        if self.plan is None:
            self.plan = self._build_plan()
        for param, lr in self.plan:
            param.add_(param.grad, alpha=-lr)
        return None


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = PlannedSGD(model.parameters(), lr=0.05)
    weights = torch.randn(8, 1, generator=generator)

    model.train()
    for step in range(args.steps):
        optimizer.eager_replan = bug_active(args, step)
        optimizer.zero_grad(set_to_none=step >= args.onset)
        x = torch.randn(32, 8, generator=generator)
        loss = F.mse_loss(model(x), x @ weights)
        loss.backward()
        before = model[0].weight.detach().clone()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f} update {(model[0].weight - before).abs().max().item():.2e}", flush=True)


if __name__ == "__main__":
    main()
