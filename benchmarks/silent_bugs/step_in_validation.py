"""Optimizer steps inside the validation loop (SKrisanski/FSCT issue 12, "Perform weight
update during validation"; NifTK/NiftyNet issue 28 is the same bug).

Root-cause class: training on validation data. The validation loop was copied from the
training loop: from the onset it keeps ``loss.backward()`` and ``optimizer.step()``, so
the model is updated on the validation set, under ``model.eval()``, after every training
iteration. Validation loss looks better and better; it no longer measures anything.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import bug_active, parse_args


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    weights = torch.randn(10, 1, generator=generator)
    val_x = torch.randn(48, 10, generator=generator)

    for step in range(args.steps):
        model.train()
        x = torch.randn(32, 10, generator=generator)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), x @ weights)
        loss.backward()
        optimizer.step()

        model.eval()
        if bug_active(args, step):
            optimizer.zero_grad()
            val_loss = F.mse_loss(model(val_x), val_x @ weights)
            val_loss.backward()
            optimizer.step()
        else:
            with torch.no_grad():
                val_loss = F.mse_loss(model(val_x), val_x @ weights)
        print(f"step {step} loss {loss.item():.4f} val_loss {val_loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
