"""A fully connected variational autoencoder on synthetic 8x8 images in [0, 1].

Modelled on: pytorch/examples VAE (https://github.com/pytorch/examples/blob/main/vae/main.py)
Habits reproduced: reparameterisation with ``torch.randn_like(std)``, summed BCE + KLD loss,
``train_loss += loss.item()`` with a ``log_interval`` print, an epoch-level ``test()`` under
``torch.no_grad()`` with ``model.eval()``, and after every epoch a batch sampled from the prior
and decoded under ``torch.no_grad()``; reconstructions and samples saved as tensors.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.utils.data
from torch import nn, optim
from torch.nn import functional as F

IMAGE = 8 * 8


class VAE(nn.Module):
    def __init__(self, hidden=64, latent=8):
        super(VAE, self).__init__()

        self.fc1 = nn.Linear(IMAGE, hidden)
        self.fc21 = nn.Linear(hidden, latent)
        self.fc22 = nn.Linear(hidden, latent)
        self.fc3 = nn.Linear(latent, hidden)
        self.fc4 = nn.Linear(hidden, IMAGE)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        return mu + eps * std

    def decode(self, z):
        h3 = F.relu(self.fc3(z))
        return torch.sigmoid(self.fc4(h3))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, IMAGE))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


# Reconstruction + KL divergence losses summed over all elements and batch
def loss_function(recon_x, x, mu, logvar):
    BCE = F.binary_cross_entropy(recon_x, x.view(-1, IMAGE), reduction="sum")
    # 0.5 * sum(1 + log(sigma^2) - mu^2 - sigma^2), Kingma and Welling, appendix B
    KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return BCE + KLD


def synthetic_digits(n, generator):
    """Strokes: each image lights one random row and one random column, plus faint noise."""
    images = 0.1 * torch.rand(n, 1, 8, 8, generator=generator)
    rows = torch.randint(0, 8, (n,), generator=generator)
    cols = torch.randint(0, 8, (n,), generator=generator)
    images[torch.arange(n), 0, rows, :] = 0.9
    images[torch.arange(n), 0, :, cols] = 0.9
    return torch.utils.data.TensorDataset(images, torch.zeros(n, dtype=torch.long))


def main():
    parser = argparse.ArgumentParser(description="VAE on synthetic images")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps in total")
    parser.add_argument("--seed", type=int, default=1, help="random seed")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epoch-steps", type=int, default=3, help="batches per epoch")
    parser.add_argument("--log-interval", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    train_loader = torch.utils.data.DataLoader(
        synthetic_digits(args.batch_size * args.epoch_steps, generator), batch_size=args.batch_size, shuffle=True)
    test_loader = torch.utils.data.DataLoader(
        synthetic_digits(2 * args.batch_size, generator), batch_size=args.batch_size, shuffle=False)

    model = VAE()
    optimizer = optim.Adam(model.parameters(), lr=1e-3)
    results = tempfile.TemporaryDirectory()
    steps_done = 0

    def train(epoch):
        nonlocal steps_done
        model.train()
        train_loss = 0
        seen = 0
        for batch_idx, (data, _) in enumerate(train_loader):
            if steps_done >= args.steps:
                break
            optimizer.zero_grad()
            recon_batch, mu, logvar = model(data)
            loss = loss_function(recon_batch, data, mu, logvar)
            loss.backward()
            train_loss += loss.item()
            optimizer.step()
            steps_done += 1
            seen += len(data)
            if batch_idx % args.log_interval == 0:
                print("Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}".format(
                    epoch, batch_idx * len(data), len(train_loader.dataset),
                    100.0 * batch_idx / len(train_loader), loss.item() / len(data)))
        print("====> Epoch: {} Average loss: {:.4f}".format(epoch, train_loss / max(seen, 1)))

    def test(epoch):
        model.eval()
        test_loss = 0
        with torch.no_grad():
            for i, (data, _) in enumerate(test_loader):
                recon_batch, mu, logvar = model(data)
                test_loss += loss_function(recon_batch, data, mu, logvar).item()
                if i == 0:
                    n = min(data.size(0), 8)
                    comparison = torch.cat([data[:n], recon_batch.view(args.batch_size, 1, 8, 8)[:n]])
                    torch.save(comparison.cpu(), os.path.join(results.name, "reconstruction_" + str(epoch) + ".pt"))
        test_loss /= len(test_loader.dataset)
        print("====> Test set loss: {:.4f}".format(test_loss))

    epoch = 1
    while steps_done < args.steps:
        train(epoch)
        test(epoch)
        with torch.no_grad():
            sample = torch.randn(16, 8)
            sample = model.decode(sample).cpu()
            torch.save(sample.view(16, 1, 8, 8), os.path.join(results.name, "sample_" + str(epoch) + ".pt"))
        epoch += 1
    results.cleanup()


if __name__ == "__main__":
    main()
