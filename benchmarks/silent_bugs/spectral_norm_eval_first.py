"""Spectral norm put in eval mode before its first forward (PyTorch issue 51800).

``torch.nn.utils.spectral_norm`` starts from random singular-vector estimates and only
refines them by power iteration in training-mode forwards. A GAN discriminator grows a
new spectrally-normalised layer at the onset (built, like every layer, when the model is
constructed, and switched on at the onset); the buggy run scores a sanity batch with
the discriminator in ``eval()`` before the new layer ever ran in training mode, so that
forward divides by a sigma estimated from random vectors (the layer's effective
spectral norm is not 1). The healthy twin warms the new layer up with a training-mode
forward first, as the module requires.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.nn import functional as F

from _common import bug_active, parse_args

warnings.filterwarnings("ignore", category=FutureWarning)  # the legacy API is the subject


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.utils.spectral_norm(nn.Linear(2, 32)), nn.LeakyReLU(0.2))
        self.grown = nn.utils.spectral_norm(nn.Linear(32, 32))  # joins the network later
        self.grown_active = False
        self.head = nn.Linear(32, 1)

    def grow(self) -> nn.Module:
        self.grown_active = True
        return self.grown

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        if self.grown_active:
            h = F.leaky_relu(self.grown(h), 0.2)
        return self.head(h)


def effective_sigma(layer: nn.Module) -> float:
    return torch.linalg.matrix_norm(layer.weight.detach(), ord=2).item()


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    disc = Discriminator()
    active = [p for name, p in disc.named_parameters() if not name.startswith("grown.")]
    optimizer = torch.optim.Adam(active, lr=1e-3, betas=(0.5, 0.999))

    disc.train()
    for step in range(args.steps):
        real = torch.randn(32, 2, generator=generator) + 2
        fake = torch.randn(32, 2, generator=generator)
        if step == args.onset:  # progressive growing: a new layer joins the discriminator
            layer = disc.grow()
            optimizer.add_param_group({"params": list(layer.parameters())})
            if not bug_active(args, step):
                with torch.no_grad():
                    disc(real)  # training-mode warm-up refines u, v
            disc.eval()
            with torch.no_grad():
                sanity = disc(real).mean().item()
            disc.train()
            print(f"step {step} sanity {sanity:.3f} new_layer_sigma {effective_sigma(layer):.3f}", flush=True)
        optimizer.zero_grad()
        loss = F.softplus(-disc(real)).mean() + F.softplus(disc(fake)).mean()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
