"""A convolutional autoencoder on synthetic 16x16 "images" (blobs), Adam with a
ReduceLROnPlateau schedule driven by a held-out reconstruction loss."""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.nn import functional as F


def blobs(generator: torch.Generator, n: int) -> torch.Tensor:
    grid = torch.stack(torch.meshgrid(torch.linspace(-1, 1, 16), torch.linspace(-1, 1, 16), indexing="ij"))
    centres = torch.rand(n, 2, 1, 1, generator=generator) * 1.6 - 0.8
    width = torch.rand(n, 1, 1, generator=generator) * 0.3 + 0.1
    return torch.exp(-((grid[None] - centres) ** 2).sum(dim=1) / width).unsqueeze(1)


class AutoEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Conv2d(1, 8, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU()
        )
        self.decoder = nn.Sequential(
            nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1), nn.ReLU(),
            nn.ConvTranspose2d(8, 1, 4, stride=2, padding=1), nn.Sigmoid(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    train, held_out = blobs(generator, 256), blobs(generator, 32)
    model = AutoEncoder()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=2)

    for step in range(args.steps):
        model.train()
        batch = train[torch.randint(0, train.shape[0], (32,), generator=generator)]
        optimizer.zero_grad()
        loss = F.mse_loss(model(batch), batch)
        loss.backward()
        optimizer.step()
        if step % 4 == 3:
            model.eval()
            with torch.no_grad():
                held_out_loss = F.mse_loss(model(held_out), held_out).item()
            plateau.step(held_out_loss)
            print(f"step {step} recon {held_out_loss:.4f}", flush=True)


if __name__ == "__main__":
    main()
