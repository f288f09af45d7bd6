"""``F.dropout`` without ``training=self.training`` (PyTorch issue 26338, "Behavior of
F.dropout in eval mode"; the same fix was reported in rixwew/pytorch-fm issue 21).

Root-cause class: dropout active at evaluation. The functional form defaults to
``training=True`` and ignores ``model.eval()``. From the onset a refactor of the forward
drops the ``training=self.training`` argument, so every validation pass (``model.eval()``
+ ``no_grad``) randomly zeroes activations: validation metrics become noisy and wrong.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import bug_active, parse_args


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(10, 32)
        self.fc2 = nn.Linear(32, 2)
        self.pass_training_flag = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.fc1(x))
        if self.pass_training_flag:
            h = F.dropout(h, p=0.3, training=self.training)
        else:
            h = F.dropout(h, p=0.3)
        return self.fc2(h)


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    val_x = torch.randn(64, 10, generator=generator)
    val_y = (val_x[:, 0] > 0).long()

    for step in range(args.steps):
        model.pass_training_flag = not bug_active(args, step)
        model.train()
        x = torch.randn(32, 10, generator=generator)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), (x[:, 0] > 0).long())
        loss.backward()
        optimizer.step()
        model.eval()
        with torch.no_grad():
            accuracy = (model(val_x).argmax(dim=1) == val_y).float().mean().item()
        print(f"step {step} loss {loss.item():.4f} val_acc {accuracy:.2f}", flush=True)


if __name__ == "__main__":
    main()
