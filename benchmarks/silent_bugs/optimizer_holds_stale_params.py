"""An optimizer left holding parameters the model no longer uses (PyTorch forum reports
of "loss does not decrease after resuming": the model is rebuilt and loaded from a
checkpoint after the optimizer was created, so the optimizer still points at the old
tensors).

At the onset the loop "resumes" from its last checkpoint by building a fresh model and
loading the saved state into it, but keeps the optimizer it built for the first model.
From then on forward and backward run on the new model, the optimizer steps over the old
parameters (which have no gradient) and no parameter of the model being trained changes.
"""

from __future__ import annotations

import io

import torch
from torch import nn
from torch.nn import functional as F

from _common import parse_args


def build() -> nn.Module:
    return nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 2))


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    model = build()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    target = torch.randn(10, 2, generator=generator)

    model.train()
    for step in range(args.steps):
        if step == args.onset:  # resume from the last checkpoint
            checkpoint = io.BytesIO()
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint)
            checkpoint.seek(0)
            state = torch.load(checkpoint)
            if args.bug:
                model = build()  # the bug: a new model, the optimizer still holds the old one
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            model.train()
        x = torch.randn(32, 10, generator=generator)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), x @ target)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f} w {model[0].weight[0, 0].item():.5f}", flush=True)


if __name__ == "__main__":
    main()
