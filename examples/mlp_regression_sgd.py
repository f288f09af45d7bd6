"""MLP regression on a synthetic non-linear target, SGD with momentum and weight decay.

The plainest supervised loop there is: the baseline every invariant in the default set
must hold on.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn


def make_data(generator: torch.Generator, n: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, 8, generator=generator)
    y = (x[:, :4].sin().sum(dim=1, keepdim=True) + 0.1 * x[:, 4:5] ** 2)
    return x, y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    x, y = make_data(generator)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    loss_fn = nn.MSELoss()

    model.train()
    for step in range(args.steps):
        index = torch.randint(0, x.shape[0], (args.batch_size,), generator=generator)
        optimizer.zero_grad()
        loss = loss_fn(model(x[index]), y[index])
        loss.backward()
        optimizer.step()
        if step % 5 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
