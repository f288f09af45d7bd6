"""Softmax applied before ``CrossEntropyLoss`` (ariecattan/SciCo issue 2, "Double-softmax in
validation loss": probabilities fed to a loss that applies log-softmax itself; the loss
"gets stuck around 1.0").

Root-cause class: loss input convention (probabilities where logits are expected). From
the onset the classifier's forward ends in ``softmax`` (moved into the model so that
inference returns probabilities) while training still uses ``F.cross_entropy``. The loss
is bounded away from zero and its gradients shrink; training crawls with no error.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import bug_active, parse_args


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 4))
        self.return_probabilities = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.body(x)
        return F.softmax(logits, dim=1) if self.return_probabilities else logits


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    model = Classifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    centres = torch.randn(4, 12, generator=generator) * 2

    model.train()
    for step in range(args.steps):
        model.return_probabilities = bug_active(args, step)
        labels = torch.randint(0, 4, (32,), generator=generator)
        x = centres[labels] + torch.randn(32, 12, generator=generator)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), labels)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
