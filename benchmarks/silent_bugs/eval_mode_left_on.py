"""Model left in eval mode after validation (a perennial forum report: ``model.train()``
forgotten after a validation pass).

Validation runs at the start of each step. From the onset the refactored validation
helper no longer restores training mode, so the training forward runs with dropout off
and BatchNorm using frozen running statistics — the model still trains, just worse.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import bug_active, parse_args


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    model = nn.Sequential(
        nn.Linear(10, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 2)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    val_x = torch.randn(64, 10, generator=generator)
    val_y = (val_x[:, 0] > 0).long()

    for step in range(args.steps):
        model.eval()
        with torch.no_grad():
            accuracy = (model(val_x).argmax(dim=1) == val_y).float().mean().item()
        if not bug_active(args, step):
            model.train()
        x = torch.randn(32, 10, generator=generator)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), (x[:, 0] > 0).long())
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f} val_acc {accuracy:.2f} training_mode {model.training}", flush=True)


if __name__ == "__main__":
    main()
