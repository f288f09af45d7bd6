"""Layers kept in a plain Python list instead of ``nn.ModuleList`` (PyTorch issue 715:
"parameters are not included if the module is initialized in a list").

Root-cause class: submodule not registered. The model grows task adapters: at the onset a
new adapter is appended and the optimizer is rebuilt from ``model.parameters()``. In the
buggy program the adapters live in a plain list, so the new adapter is not a registered
submodule: its parameters are missing from ``model.parameters()``, never reach the
optimizer and never change, while the forward uses them on every batch.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import parse_args


class Net(nn.Module):
    def __init__(self, registered: bool) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(10, 24), nn.Tanh())
        self.adapters = nn.ModuleList() if registered else []
        self.head = nn.Linear(24, 1)

    def add_adapter(self) -> None:
        self.adapters.append(nn.Linear(24, 24))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.trunk(x)
        for adapter in self.adapters:
            h = h + adapter(h)
        return self.head(h)


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    model = Net(registered=not args.bug)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    weights = torch.randn(10, 1, generator=generator)

    model.train()
    for step in range(args.steps):
        if step == args.onset:  # a new task: grow an adapter and rebuild the optimizer
            model.add_adapter()
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        x = torch.randn(32, 10, generator=generator)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), torch.sin(x @ weights))
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f} registered_params {len(list(model.parameters()))}", flush=True)


if __name__ == "__main__":
    main()
