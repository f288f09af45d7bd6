"""Distance-aware uncertainty: a spectrally normalised residual classifier (SNGP-style).

Modelled on: google/uncertainty-baselines' SNGP recipe as ported to PyTorch (e.g. the
"SNGP" PyTorch implementations of its residual MLP): hidden layers wrapped in
``nn.utils.spectral_norm`` to keep the feature map distance-preserving, residual
connections, a random-Fourier-feature output layer with a frozen projection, SGD with
momentum and cosine annealing, evaluation of accuracy and mean predictive entropy on a
held-out split under ``torch.no_grad`` after ``model.eval()``.
"""

from __future__ import annotations

import argparse
import math

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import spectral_norm


class SNResidualMLP(nn.Module):
    def __init__(self, features: int = 2, hidden: int = 32, depth: int = 3, classes: int = 2,
                 rff: int = 64) -> None:
        super().__init__()
        self.input = nn.Linear(features, hidden)
        self.blocks = nn.ModuleList(spectral_norm(nn.Linear(hidden, hidden)) for _ in range(depth))
        self.dropout = nn.Dropout(0.1)
        projection = torch.randn(rff, hidden) / math.sqrt(hidden)
        self.register_buffer("rff_weight", projection)
        self.register_buffer("rff_bias", torch.rand(rff) * 2 * math.pi)
        self.output = nn.Linear(rff, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.input(x)
        for block in self.blocks:
            h = h + self.dropout(F.relu(block(h)))
        features = math.sqrt(2.0 / self.rff_weight.shape[0]) * torch.cos(h @ self.rff_weight.T + self.rff_bias)
        return self.output(features)


def two_moons(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    angle = torch.rand(n, generator=generator) * math.pi
    label = torch.randint(0, 2, (n,), generator=generator)
    x = torch.stack([torch.cos(angle), torch.sin(angle)], 1)
    x = torch.where(label.unsqueeze(1) == 1, torch.stack([1 - x[:, 0], 0.5 - x[:, 1]], 1), x)
    return x + 0.1 * torch.randn(n, 2, generator=generator), label


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=3)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    data = torch.Generator().manual_seed(args.seed + 1)
    model = SNResidualMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    val_x, val_y = two_moons(128, data)

    for step in range(args.steps):
        model.train()
        x, y = two_moons(64, data)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        scheduler.step()
        if (step + 1) % args.eval_every == 0:
            model.eval()
            with torch.no_grad():
                probs = F.softmax(model(val_x), dim=-1)
                accuracy = (probs.argmax(1) == val_y).float().mean().item()
                entropy = -(probs * probs.clamp_min(1e-8).log()).sum(1).mean().item()
            print(f"step {step + 1} loss {loss.item():.4f} val acc {accuracy:.3f} entropy {entropy:.3f}", flush=True)


if __name__ == "__main__":
    main()
