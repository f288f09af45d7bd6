"""Healthy: a test function that re-seeds before evaluating (the pattern of many research
scripts and of pytorch/examples-style ``test(model)`` helpers: ``torch.manual_seed(0)``
so that evaluation-time sampling — dropout-free here, but random crops or noise in
general — is reproducible, then ``model.eval()``, then back to ``model.train()``).

Seeding inside evaluation is not a training-time re-seed: the training loop's data comes
from its own generator and is unaffected. Must be clean.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import parse_args


def test(model: nn.Module, generator_seed: int) -> float:
    torch.manual_seed(generator_seed)
    model.eval()
    with torch.no_grad():
        x = torch.randn(64, 10)
        noisy = x + 0.01 * torch.randn_like(x)
        loss = F.cross_entropy(model(noisy), (x[:, 0] > 0).long()).item()
    model.train()
    return loss


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    model.train()
    for step in range(args.steps):
        x = torch.randn(32, 10, generator=generator)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), (x[:, 0] > 0).long())
        loss.backward()
        optimizer.step()
        if step % 2 == 1:
            print(f"step {step} loss {loss.item():.4f} test_loss {test(model, 0):.4f}", flush=True)


if __name__ == "__main__":
    main()
