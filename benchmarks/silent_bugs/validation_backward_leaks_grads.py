"""Validation loss back-propagated, its gradients left for the next training step
(harvardnlp/annotated-transformer issue 14: ``loss.backward()`` runs in the loss helper even
during validation, "so you are training on the validation data").

Root-cause class: validation gradients leak into training. The training step clears
gradients *after* ``optimizer.step()`` (the annotated-transformer order). From the onset
the shared loss helper also calls ``backward()`` in the validation pass, which has no
optimizer: the validation gradients stay in ``.grad`` and are added to the next training
batch's gradients, so every update is partly fitted to the validation set.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import bug_active, parse_args


def compute_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, optimizer, backward: bool) -> float:
    loss = F.mse_loss(model(x), y)
    if backward:
        loss.backward()
    if optimizer is not None:
        optimizer.step()
        optimizer.zero_grad()
    return loss.item()


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    weights = torch.randn(10, 1, generator=generator)
    val_x = torch.randn(48, 10, generator=generator)

    for step in range(args.steps):
        model.train()
        x = torch.randn(32, 10, generator=generator)
        loss = compute_loss(model, x, x @ weights, optimizer, backward=True)
        model.eval()
        val_loss = compute_loss(model, val_x, val_x @ weights, None, backward=bug_active(args, step))
        leaked = model[0].weight.grad.abs().sum().item() if model[0].weight.grad is not None else 0.0
        print(f"step {step} loss {loss:.4f} val_loss {val_loss:.4f} leaked_grad {leaked:.3f}", flush=True)


if __name__ == "__main__":
    main()
