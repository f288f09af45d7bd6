"""A Wasserstein GAN with gradient penalty on synthetic 8x8 images, with several critic updates per generator update.

Modelled on: eriklindernoren/PyTorch-GAN WGAN-GP
(https://github.com/eriklindernoren/PyTorch-GAN/blob/master/implementations/wgan_gp/wgan_gp.py)
Habits reproduced: the legacy ``Tensor = torch.FloatTensor`` / ``Variable`` idiom, MLP
generator blocks with ``BatchNorm1d(out_feat, 0.8)`` (0.8 passed positionally as eps), a
gradient penalty from ``autograd.grad(..., create_graph=True, retain_graph=True,
only_inputs=True)`` on random interpolates, the critic trained every batch on fakes that are
not detached (the generator's stray gradients are cleared by ``optimizer_G.zero_grad()`` before
its own update), the generator trained when ``i % n_critic == 0``, and ``batches_done`` advanced
by ``n_critic`` to time sample saving. ``--steps`` counts generator updates; the loop stops
right after the last one.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import torch
import torch.autograd as autograd
import torch.nn as nn
from torch.autograd import Variable
from torch.utils.data import DataLoader, TensorDataset


class Generator(nn.Module):
    def __init__(self, latent_dim, img_shape):
        super(Generator, self).__init__()
        self.img_shape = img_shape

        def block(in_feat, out_feat, normalize=True):
            layers = [nn.Linear(in_feat, out_feat)]
            if normalize:
                layers.append(nn.BatchNorm1d(out_feat, 0.8))
            layers.append(nn.LeakyReLU(0.2, inplace=True))
            return layers

        self.model = nn.Sequential(
            *block(latent_dim, 32, normalize=False),
            *block(32, 64),
            *block(64, 128),
            nn.Linear(128, int(np.prod(img_shape))),
            nn.Tanh(),
        )

    def forward(self, z):
        img = self.model(z)
        img = img.view(img.shape[0], *self.img_shape)
        return img


class Discriminator(nn.Module):
    def __init__(self, img_shape):
        super(Discriminator, self).__init__()

        self.model = nn.Sequential(
            nn.Linear(int(np.prod(img_shape)), 64),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(64, 32),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(32, 1),
        )

    def forward(self, img):
        img_flat = img.view(img.shape[0], -1)
        validity = self.model(img_flat)
        return validity


Tensor = torch.FloatTensor


def compute_gradient_penalty(D, real_samples, fake_samples):
    """Calculates the gradient penalty loss for WGAN GP"""
    # Random weight term for interpolation between real and fake samples
    alpha = Tensor(np.random.random((real_samples.size(0), 1, 1, 1)))
    # Get random interpolation between real and fake samples
    interpolates = (alpha * real_samples + ((1 - alpha) * fake_samples)).requires_grad_(True)
    d_interpolates = D(interpolates)
    fake = Variable(Tensor(real_samples.shape[0], 1).fill_(1.0), requires_grad=False)
    # Get gradient w.r.t. interpolates
    gradients = autograd.grad(
        outputs=d_interpolates,
        inputs=interpolates,
        grad_outputs=fake,
        create_graph=True,
        retain_graph=True,
        only_inputs=True,
    )[0]
    gradients = gradients.view(gradients.size(0), -1)
    gradient_penalty = ((gradients.norm(2, dim=1) - 1) ** 2).mean()
    return gradient_penalty


def synthetic_images(n, channels, img_size, seed):
    """Diagonal gradients with a random phase per image, scaled to [-1, 1]."""
    generator = torch.Generator().manual_seed(seed)
    grid = torch.arange(img_size).float()
    ramp = (grid.view(-1, 1) + grid.view(1, -1)) / (2 * img_size)
    phase = torch.rand(n, 1, 1, 1, generator=generator)
    images = torch.sin(2 * np.pi * (ramp + phase)).expand(n, channels, img_size, img_size)
    return TensorDataset(images.contiguous(), torch.zeros(n))


def main():
    parser = argparse.ArgumentParser(description="WGAN-GP on synthetic images")
    parser.add_argument("--steps", type=int, default=8, help="generator updates in total")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.0002)
    parser.add_argument("--b1", type=float, default=0.5)
    parser.add_argument("--b2", type=float, default=0.999)
    parser.add_argument("--latent_dim", type=int, default=16)
    parser.add_argument("--img_size", type=int, default=8)
    parser.add_argument("--channels", type=int, default=1)
    parser.add_argument("--n_critic", type=int, default=2, help="critic updates per generator update")
    parser.add_argument("--sample_interval", type=int, default=8, help="batches between image samples")
    opt = parser.parse_args()
    print(opt)

    np.random.seed(opt.seed)
    torch.manual_seed(opt.seed)
    img_shape = (opt.channels, opt.img_size, opt.img_size)

    # Loss weight for gradient penalty
    lambda_gp = 10

    # Initialize generator and discriminator
    generator = Generator(opt.latent_dim, img_shape)
    discriminator = Discriminator(img_shape)

    dataloader = DataLoader(
        synthetic_images(opt.batch_size * 5, opt.channels, opt.img_size, opt.seed),
        batch_size=opt.batch_size, shuffle=True, drop_last=True)

    # Optimizers
    optimizer_G = torch.optim.Adam(generator.parameters(), lr=opt.lr, betas=(opt.b1, opt.b2))
    optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=opt.lr, betas=(opt.b1, opt.b2))

    images_dir = tempfile.TemporaryDirectory()
    batches_done = 0
    generator_updates = 0
    epoch = 0
    i = 0
    while generator_updates < opt.steps:
        for imgs, _ in dataloader:
            if generator_updates >= opt.steps:
                break

            # Configure input
            real_imgs = Variable(imgs.type(Tensor))

            # ---------------------
            #  Train Discriminator
            # ---------------------

            optimizer_D.zero_grad()

            # Sample noise as generator input
            z = Variable(Tensor(np.random.normal(0, 1, (imgs.shape[0], opt.latent_dim))))

            # Generate a batch of images
            fake_imgs = generator(z)

            # Real images
            real_validity = discriminator(real_imgs)
            # Fake images
            fake_validity = discriminator(fake_imgs)
            # Gradient penalty
            gradient_penalty = compute_gradient_penalty(discriminator, real_imgs.data, fake_imgs.data)
            # Adversarial loss
            d_loss = -torch.mean(real_validity) + torch.mean(fake_validity) + lambda_gp * gradient_penalty

            d_loss.backward()
            optimizer_D.step()

            optimizer_G.zero_grad()

            # Train the generator every n_critic steps
            if i % opt.n_critic == 0:

                # -----------------
                #  Train Generator
                # -----------------

                # Generate a batch of images
                fake_imgs = generator(z)
                # Loss measures generator's ability to fool the discriminator
                # Train on fake images
                fake_validity = discriminator(fake_imgs)
                g_loss = -torch.mean(fake_validity)

                g_loss.backward()
                optimizer_G.step()
                generator_updates += 1

                print("[Epoch %d] [Batch %d] [D loss: %f] [G loss: %f]" % (epoch, i, d_loss.item(), g_loss.item()))

                if batches_done % opt.sample_interval == 0:
                    torch.save(fake_imgs.data[:8], os.path.join(images_dir.name, "%d.pt" % batches_done))

                batches_done += opt.n_critic
            i += 1
        epoch += 1
    images_dir.cleanup()


if __name__ == "__main__":
    main()
