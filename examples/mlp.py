"""A healthy MLP classifier on synthetic data: the smallest realistic training loop.

Plain PyTorch with no trainwatch imports, so it can be run unmodified under
``trainwatch collect -- python examples/mlp.py --steps 20``.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn


def build_model(in_features: int, hidden: int, classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(in_features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, classes),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    parser.add_argument(
        "--freeze-first-layer",
        action="store_true",
        help="set requires_grad=False on the first layer (a legitimately frozen layer)",
    )
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    in_features, classes = 16, 4
    model = build_model(in_features, args.hidden, classes)
    if args.freeze_first_layer:
        for param in model[0].parameters():
            param.requires_grad_(False)
    if args.optimizer == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr / 10)
    loss_fn = nn.CrossEntropyLoss()
    # A fixed random "teacher" makes the task learnable, so the loss really falls.
    teacher = torch.randn(in_features, classes)

    model.train()
    loss = torch.tensor(float("nan"))
    for _ in range(args.steps):
        inputs = torch.randn(args.batch_size, in_features)
        targets = (inputs @ teacher).argmax(dim=1)
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
    print(f"mlp: {args.steps} steps, final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
