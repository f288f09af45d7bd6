"""Self-attention GAN with spectral normalisation in both networks and the hinge loss.

Modelled on: heykeetae/Self-Attention-GAN (sagan_models.py, trainer.py): every
convolution of the generator and discriminator wrapped in ``nn.utils.spectral_norm``, a
self-attention block with a learned ``gamma``, two-timescale update rule (separate
Adam learning rates), hinge loss, ``d_optimizer.zero_grad()``/``g_optimizer.zero_grad()``
through a ``reset_grad()`` helper, fixed noise for periodic samples under ``no_grad``.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import spectral_norm

Z_DIM, CH, SIZE = 16, 16, 8


class SelfAttention(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.query = spectral_norm(nn.Conv2d(channels, channels // 4, 1))
        self.key = spectral_norm(nn.Conv2d(channels, channels // 4, 1))
        self.value = spectral_norm(nn.Conv2d(channels, channels, 1))
        self.gamma = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        q = self.query(x).flatten(2).transpose(1, 2)
        k = self.key(x).flatten(2)
        attention = torch.softmax(q @ k, dim=-1)
        out = (self.value(x).flatten(2) @ attention.transpose(1, 2)).view(b, c, h, w)
        return x + self.gamma * out


class Generator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.project = spectral_norm(nn.ConvTranspose2d(Z_DIM, CH, 4))
        self.up = spectral_norm(nn.ConvTranspose2d(CH, CH, 4, 2, 1))
        self.attention = SelfAttention(CH)
        self.out = nn.Conv2d(CH, 3, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.project(z.view(-1, Z_DIM, 1, 1)))
        h = self.attention(F.relu(self.up(h)))
        return torch.tanh(self.out(h))


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = spectral_norm(nn.Conv2d(3, CH, 4, 2, 1))
        self.attention = SelfAttention(CH)
        self.conv2 = spectral_norm(nn.Conv2d(CH, CH, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.attention(F.leaky_relu(self.conv1(x), 0.1))
        return self.conv2(F.leaky_relu(h, 0.1)).view(-1)


def real_batch(generator: torch.Generator, n: int) -> torch.Tensor:
    """Smooth colour gradients: an easy 'dataset' a GAN can start to match."""
    base = torch.linspace(-1, 1, SIZE)
    grid = base.view(1, 1, SIZE, 1) * torch.rand(n, 3, 1, 1, generator=generator)
    return (grid + base.view(1, 1, 1, SIZE) * torch.rand(n, 3, 1, 1, generator=generator)).clamp(-1, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--sample-every", type=int, default=4)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    data = torch.Generator().manual_seed(args.seed + 1)
    G, D = Generator(), Discriminator()
    g_optimizer = torch.optim.Adam(G.parameters(), lr=1e-4, betas=(0.0, 0.9))
    d_optimizer = torch.optim.Adam(D.parameters(), lr=4e-4, betas=(0.0, 0.9))
    fixed_z = torch.randn(8, Z_DIM, generator=data)

    def reset_grad() -> None:
        d_optimizer.zero_grad()
        g_optimizer.zero_grad()

    G.train()
    D.train()
    for step in range(args.steps):
        real = real_batch(data, args.batch_size)
        d_loss = F.relu(1.0 - D(real)).mean() + F.relu(1.0 + D(G(torch.randn(args.batch_size, Z_DIM)).detach())).mean()
        reset_grad()
        d_loss.backward()
        d_optimizer.step()

        g_loss = -D(G(torch.randn(args.batch_size, Z_DIM))).mean()
        reset_grad()
        g_loss.backward()
        g_optimizer.step()
        if (step + 1) % args.sample_every == 0:
            with torch.no_grad():
                samples = G(fixed_z)
            print(f"step {step + 1} d_loss {d_loss.item():.3f} g_loss {g_loss.item():.3f} "
                  f"gamma {G.attention.gamma.item():.4f} sample std {samples.std().item():.3f}", flush=True)


if __name__ == "__main__":
    main()
