"""BYOL self-supervised pre-training of a small convnet on synthetic images, with a momentum target network.

Modelled on: lucidrains/byol-pytorch (https://github.com/lucidrains/byol-pytorch,
byol_pytorch/byol_pytorch.py)
Habits reproduced: an online network made of an encoder plus an MLP projector (Linear,
BatchNorm1d, ReLU, Linear) and a predictor of the same shape, a target encoder+projector built
with ``copy.deepcopy`` of the online one and frozen with ``requires_grad_(False)``, two augmented
views per image, target projections computed under ``torch.no_grad()`` and ``detach``ed, a
symmetric loss ``2 - 2 * cos`` between each view's prediction and the other view's target
projection, Adam over the online encoder, projector and predictor, and after every optimizer step
a momentum update of the target done in place on its parameters under ``torch.no_grad()``
(``mul_(tau).add_(online, alpha=1 - tau)``) with tau following a cosine schedule from 0.99 to 1.
"""

from __future__ import annotations

import argparse
import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def MLP(dim, projection_size, hidden_size=64):
    return nn.Sequential(
        nn.Linear(dim, hidden_size),
        nn.BatchNorm1d(hidden_size),
        nn.ReLU(inplace=True),
        nn.Linear(hidden_size, projection_size),
    )


class Encoder(nn.Module):
    """A small convnet standing in for a ResNet trunk; returns the pooled representation."""

    def __init__(self, dim=32):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
            nn.Conv2d(16, dim, 3, stride=2, padding=1), nn.BatchNorm2d(dim), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
        )

    def forward(self, x):
        return torch.flatten(self.net(x), 1)


class NetWrapper(nn.Module):
    """Encoder followed by the projection head; returns (projection, representation)."""

    def __init__(self, encoder, repr_dim, projection_size, hidden_size):
        super().__init__()
        self.encoder = encoder
        self.projector = MLP(repr_dim, projection_size, hidden_size)

    def forward(self, x):
        representation = self.encoder(x)
        return self.projector(representation), representation


def loss_fn(x, y):
    x = F.normalize(x, dim=-1, p=2)
    y = F.normalize(y, dim=-1, p=2)
    return 2 - 2 * (x * y).sum(dim=-1)


def augment(images, generator, pad=2):
    """Random crop (pad then slice back), horizontal flip and Gaussian noise, per image."""
    n, _, h, w = images.shape
    padded = F.pad(images, (pad, pad, pad, pad), mode="reflect")
    offsets = torch.randint(0, 2 * pad + 1, (n, 2), generator=generator)
    out = torch.stack([padded[i, :, t:t + h, l:l + w] for i, (t, l) in enumerate(offsets.tolist())])
    flip = torch.rand(n, generator=generator) < 0.5
    out = torch.where(flip[:, None, None, None], out.flip(-1), out)
    return out + 0.1 * torch.randn(out.shape, generator=generator)


class BYOL(nn.Module):
    def __init__(self, repr_dim=32, projection_size=16, projection_hidden_size=64, base_tau=0.99):
        super().__init__()
        self.online_encoder = NetWrapper(Encoder(repr_dim), repr_dim, projection_size, projection_hidden_size)
        self.online_predictor = MLP(projection_size, projection_size, projection_hidden_size)
        self.target_encoder = copy.deepcopy(self.online_encoder)
        self.target_encoder.requires_grad_(False)
        self.base_tau = base_tau

    def online_parameters(self):
        return list(self.online_encoder.parameters()) + list(self.online_predictor.parameters())

    def tau(self, step, total_steps):
        # cosine increase from base_tau to 1 over training, as in the BYOL paper
        return 1 - (1 - self.base_tau) * (math.cos(math.pi * step / total_steps) + 1) / 2

    def update_moving_average(self, tau):
        with torch.no_grad():
            for t, o in zip(self.target_encoder.parameters(), self.online_encoder.parameters()):
                t.mul_(tau).add_(o, alpha=1 - tau)

    def forward(self, image_one, image_two):
        online_proj_one, _ = self.online_encoder(image_one)
        online_proj_two, _ = self.online_encoder(image_two)
        online_pred_one = self.online_predictor(online_proj_one)
        online_pred_two = self.online_predictor(online_proj_two)

        with torch.no_grad():
            target_proj_one, _ = self.target_encoder(image_one)
            target_proj_two, _ = self.target_encoder(image_two)
            target_proj_one.detach_()
            target_proj_two.detach_()

        loss_one = loss_fn(online_pred_one, target_proj_two)
        loss_two = loss_fn(online_pred_two, target_proj_one)
        return (loss_one + loss_two).mean()


def synthetic_images(n, size, seed):
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.rand(n, 3, size // 4, size // 4, generator=generator)
    return F.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)


def main():
    parser = argparse.ArgumentParser(description="BYOL on synthetic images")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps in total")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--base-tau", type=float, default=0.99)
    parser.add_argument("--log-every", type=int, default=5)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    images = synthetic_images(args.batch_size * 4, args.image_size, args.seed)
    loader = torch.utils.data.DataLoader(images, batch_size=args.batch_size, shuffle=True, drop_last=True)
    aug_generator = torch.Generator().manual_seed(args.seed + 1)

    learner = BYOL(base_tau=args.base_tau)
    opt = torch.optim.Adam(learner.online_parameters(), lr=args.lr)
    learner.train()

    step = 0
    while step < args.steps:
        for batch in loader:
            if step >= args.steps:
                break
            view_one = augment(batch, aug_generator)
            view_two = augment(batch, aug_generator)
            loss = learner(view_one, view_two)
            opt.zero_grad()
            loss.backward()
            opt.step()
            tau = learner.tau(step, args.steps)
            learner.update_moving_average(tau)
            step += 1
            if step % args.log_every == 0 or step == args.steps:
                print(f"step {step} loss {loss.item():.4f} tau {tau:.4f}")

    # the online encoder is what BYOL keeps for downstream use
    learner.eval()
    with torch.no_grad():
        _, embedding = learner.online_encoder(images[:8])
    print(f"done: embedding shape {tuple(embedding.shape)}")


if __name__ == "__main__":
    main()
