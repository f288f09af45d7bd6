"""Evaluation without ``model.eval()`` (fxia22/pointnet.pytorch pull request 19: "the
training scripts do not set the model to eval during test").

Root-cause class: BatchNorm statistics updated by evaluation data. From the onset the
evaluation helper only wraps the forward in ``torch.no_grad()`` and no longer switches the
model to eval mode: BatchNorm normalises validation batches with their own statistics and
folds them into its running estimates, and dropout stays on. Nothing errors; the reported
validation accuracy and the stored running statistics are both wrong.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import bug_active, parse_args


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, switch_mode: bool) -> float:
    if switch_mode:
        model.eval()
    with torch.no_grad():
        accuracy = (model(x).argmax(dim=1) == y).float().mean().item()
    model.train()
    return accuracy


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(10, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    val_x = torch.randn(64, 10, generator=generator) * 3 + 1  # validation data from a shifted distribution
    val_y = (val_x[:, 0] > 1).long()

    model.train()
    for step in range(args.steps):
        x = torch.randn(32, 10, generator=generator)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), (x[:, 0] > 0).long())
        loss.backward()
        optimizer.step()
        accuracy = evaluate(model, val_x, val_y, switch_mode=not bug_active(args, step))
        print(f"step {step} loss {loss.item():.4f} val_acc {accuracy:.2f} "
              f"running_mean {model[1].running_mean.abs().mean().item():.3f}", flush=True)


if __name__ == "__main__":
    main()
