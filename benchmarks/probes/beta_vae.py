"""Healthy probe: a convolutional beta-VAE in the style of 1Konny/Beta-VAE (Burgess et al.'s capacity-annealed objective gamma * |KL - C|, a reconstruction_loss(x, x_recon, distribution) helper), one fresh model per decoder distribution: Bernoulli on logits, Bernoulli on a sigmoid's probabilities with F.binary_cross_entropy, Gaussian as MSE on the sigmoid.

Loss-input edges: binary_cross_entropy and mse_loss take a sigmoid's output (correct there);
binary_cross_entropy_with_logits takes the decoder's raw logits; every reconstruction has the
image's shape (B, 1, 16, 16).
"""
import argparse

import torch
import torch.nn.functional as F
from torch import nn


class BetaVAE(nn.Module):
    def __init__(self, z_dim=6):
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(1, 8, 4, 2, 1), nn.ReLU(True), nn.Conv2d(8, 16, 4, 2, 1), nn.ReLU(True),
                                     nn.Flatten(), nn.Linear(16 * 4 * 4, 2 * z_dim))
        self.decoder = nn.Sequential(nn.Linear(z_dim, 16 * 4 * 4), nn.Unflatten(1, (16, 4, 4)), nn.ReLU(True),
                                     nn.ConvTranspose2d(16, 8, 4, 2, 1), nn.ReLU(True),
                                     nn.ConvTranspose2d(8, 1, 4, 2, 1))
        self.z_dim = z_dim

    def forward(self, x):
        distributions = self.encoder(x)
        mu, logvar = distributions[:, :self.z_dim], distributions[:, self.z_dim:]
        z = mu + torch.exp(0.5 * logvar) * torch.randn_like(mu)
        return self.decoder(z), mu, logvar              # decoder returns logits


def reconstruction_loss(x, x_recon, distribution):
    batch_size = x.size(0)
    if distribution == "bernoulli":
        return F.binary_cross_entropy_with_logits(x_recon, x, reduction="sum") / batch_size
    x_recon = torch.sigmoid(x_recon)
    if distribution == "bernoulli_probs":
        return F.binary_cross_entropy(x_recon, x, reduction="sum") / batch_size
    return F.mse_loss(x_recon, x, reduction="sum") / batch_size   # gaussian


def kl_divergence(mu, logvar):
    return (-0.5 * (1 + logvar - mu.pow(2) - logvar.exp())).sum(1).mean()


def images(gen, n=16):
    """Blurry synthetic blobs in [0, 1]."""
    yy, xx = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    centre = torch.rand(n, 2, generator=gen) * 10 + 3
    d2 = (yy - centre[:, 0, None, None]) ** 2 + (xx - centre[:, 1, None, None]) ** 2
    return torch.exp(-d2 / 8).unsqueeze(1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps per distribution")
    parser.add_argument("--gamma", type=float, default=10.0)
    parser.add_argument("--C-max", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)

    for distribution in ("bernoulli", "bernoulli_probs", "gaussian"):
        net = BetaVAE()
        optim = torch.optim.Adam(net.parameters(), lr=1e-3, betas=(0.9, 0.999))
        net.train()
        for global_iter in range(1, args.steps + 1):
            x = images(gen)
            x_recon, mu, logvar = net(x)
            recon_loss = reconstruction_loss(x, x_recon, distribution)
            total_kld = kl_divergence(mu, logvar)
            C = min(args.C_max, args.C_max * global_iter / args.steps)
            beta_vae_loss = recon_loss + args.gamma * (total_kld - C).abs()
            optim.zero_grad()
            beta_vae_loss.backward()
            optim.step()
        net.eval()
        with torch.no_grad():
            x = images(gen, 32)
            x_recon, mu, logvar = net(x)
            print(f"{distribution}: recon {reconstruction_loss(x, x_recon, distribution).item():.3f} "
                  f"kld {kl_divergence(mu, logvar).item():.3f}")


if __name__ == "__main__":
    main()
