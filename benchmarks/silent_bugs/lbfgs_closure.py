"""Healthy: full-batch L-BFGS with a closure (the pattern of pytorch/examples' time-sequence
prediction and of style-transfer scripts). Every forward and backward of the run happens
inside the closure that ``optimizer.step(closure)`` calls, several times per step.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import parse_args


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    x = torch.linspace(-2, 2, 64).unsqueeze(1)
    y = torch.sin(2 * x) + 0.05 * torch.randn(64, 1, generator=generator)
    model = nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4, history_size=5)

    model.train()
    for step in range(args.steps):
        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            return loss

        loss = optimizer.step(closure)
        print(f"step {step} loss {loss.item():.5f}", flush=True)


if __name__ == "__main__":
    main()
