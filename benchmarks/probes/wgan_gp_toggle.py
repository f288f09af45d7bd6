"""Healthy probe: WGAN-GP on the 8-Gaussians toy as in the PyTorch ports of Gulrajani et al.'s gan_toy (caogang/wgan-gp gan_toy.py habits): the critic trained CRITIC_ITERS times per generator step with Module.zero_grad(), three separate backward calls (real with a -1 gradient, fake with +1, the gradient penalty) before optimizerD.step(), the penalty from torch.autograd.grad(create_graph=True) on random interpolates, Adam(lr=1e-4, betas=(0.5, 0.9)) for both nets, and the critic's parameters switched to requires_grad=False during the generator step and back on for the critic.

Fakes for the critic are detached, so the generator never receives critic-phase gradients;
its own update backpropagates through the frozen critic into the generator only.
"""
import argparse
import math

import torch
from torch import autograd, nn

DIM = 64


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(2, DIM), nn.ReLU(True), nn.Linear(DIM, DIM), nn.ReLU(True),
                                  nn.Linear(DIM, 2))

    def forward(self, noise):
        return self.main(noise)


class Critic(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(2, DIM), nn.ReLU(True), nn.Linear(DIM, DIM), nn.ReLU(True),
                                  nn.Linear(DIM, 1))

    def forward(self, x):
        return self.main(x).view(-1)


def eight_gaussians(gen, batch_size, scale=2.0):
    angles = torch.arange(8, dtype=torch.float32) * (2 * math.pi / 8)
    centers = torch.stack([angles.cos(), angles.sin()], 1) * scale
    pick = torch.randint(0, 8, (batch_size,), generator=gen)
    points = centers[pick] + 0.02 * torch.randn(batch_size, 2, generator=gen)
    return points / 1.414


def gradient_penalty(critic, real, fake, lam):
    alpha = torch.rand(real.size(0), 1).expand_as(real)
    interpolates = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
    scores = critic(interpolates)
    grads = autograd.grad(outputs=scores, inputs=interpolates, grad_outputs=torch.ones_like(scores),
                          create_graph=True, retain_graph=True, only_inputs=True)[0]
    return ((grads.norm(2, dim=1) - 1) ** 2).mean() * lam


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6, help="generator iterations")
    parser.add_argument("--critic-iters", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lam", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)

    netG, netD = Generator(), Critic()
    optimizerD = torch.optim.Adam(netD.parameters(), lr=1e-4, betas=(0.5, 0.9))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=1e-4, betas=(0.5, 0.9))
    one = torch.tensor(1.0)
    mone = one * -1

    for iteration in range(args.steps):
        # (1) critic: maximise D(real) - D(fake) - penalty
        for p in netD.parameters():
            p.requires_grad = True
        for _ in range(args.critic_iters):
            real = eight_gaussians(gen, args.batch_size)
            netD.zero_grad()
            D_real = netD(real).mean()
            D_real.backward(mone)
            with torch.no_grad():
                fake = netG(torch.randn(args.batch_size, 2))
            D_fake = netD(fake).mean()
            D_fake.backward(one)
            penalty = gradient_penalty(netD, real, fake, args.lam)
            penalty.backward()
            D_cost = D_fake - D_real + penalty
            wasserstein_d = D_real - D_fake
            optimizerD.step()

        # (2) generator: the critic is a fixed function here
        for p in netD.parameters():
            p.requires_grad = False
        netG.zero_grad()
        fake = netG(torch.randn(args.batch_size, 2))
        G = netD(fake).mean()
        G.backward(mone)
        G_cost = -G
        optimizerG.step()
        print(f"iter {iteration + 1} D_cost {D_cost.item():.4f} G_cost {G_cost.item():.4f} "
              f"W_dist {wasserstein_d.item():.4f}")

    with torch.no_grad():
        samples = netG(torch.randn(256, 2))
    print(f"sample spread {samples.std(0).mean().item():.4f}")


if __name__ == "__main__":
    main()
