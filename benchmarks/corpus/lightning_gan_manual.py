"""A GAN trained with PyTorch Lightning's manual optimization on synthetic 8x8 images.

Modelled on: the Lightning "Basic GAN" tutorial
(https://lightning.ai/docs/pytorch/stable/notebooks/lightning_examples/basic-gan.html)
Habits reproduced: a ``LightningDataModule`` with ``setup()``/``train_dataloader()``, a
``LightningModule`` with ``self.automatic_optimization = False`` and ``save_hyperparameters()``,
two Adam optimizers returned from ``configure_optimizers``, generator step first then
discriminator step, each wrapped in ``toggle_optimizer``/``untoggle_optimizer`` and driven with
``self.manual_backward``, ``opt.step()``, ``opt.zero_grad()``, the discriminator fed
``self(z).detach()``, ``self.log`` of both losses with ``prog_bar=True``, and fixed
``validation_z`` samples generated in ``on_train_epoch_end``. The Trainer runs on the CPU with
``limit_train_batches`` bounding the run and a ``ModelCheckpoint`` written to a temporary
directory.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import warnings

import lightning as L
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset


class SyntheticDataModule(L.LightningDataModule):
    def __init__(self, batch_size: int = 16, num_batches: int = 8, seed: int = 0):
        super().__init__()
        self.batch_size = batch_size
        self.num_batches = num_batches
        self.seed = seed
        self.dims = (1, 8, 8)

    def setup(self, stage=None):
        generator = torch.Generator().manual_seed(self.seed)
        n = self.batch_size * self.num_batches
        rows = torch.randint(0, 8, (n,), generator=generator)
        images = -torch.ones(n, *self.dims)
        images[torch.arange(n), 0, rows, :] = 1.0
        images = images + 0.1 * torch.randn(n, *self.dims, generator=generator)
        self.train_set = TensorDataset(images, rows)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, num_workers=0)


class Generator(nn.Module):
    def __init__(self, latent_dim, img_shape):
        super().__init__()
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
            nn.Linear(64, int(np.prod(img_shape))),
            nn.Tanh(),
        )

    def forward(self, z):
        img = self.model(z)
        img = img.view(img.size(0), *self.img_shape)
        return img


class Discriminator(nn.Module):
    def __init__(self, img_shape):
        super().__init__()

        self.model = nn.Sequential(
            nn.Linear(int(np.prod(img_shape)), 64),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(64, 32),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(32, 1),
            nn.Sigmoid(),
        )

    def forward(self, img):
        img_flat = img.view(img.size(0), -1)
        validity = self.model(img_flat)
        return validity


class GAN(L.LightningModule):
    def __init__(self, channels, width, height, latent_dim: int = 16, lr: float = 0.0002,
                 b1: float = 0.5, b2: float = 0.999, samples_dir: str = ""):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False

        data_shape = (channels, width, height)
        self.generator = Generator(latent_dim=self.hparams.latent_dim, img_shape=data_shape)
        self.discriminator = Discriminator(img_shape=data_shape)

        self.validation_z = torch.randn(8, self.hparams.latent_dim)
        self.example_input_array = torch.zeros(2, self.hparams.latent_dim)

    def forward(self, z):
        return self.generator(z)

    def adversarial_loss(self, y_hat, y):
        return F.binary_cross_entropy(y_hat, y)

    def training_step(self, batch):
        imgs, _ = batch

        optimizer_g, optimizer_d = self.optimizers()

        # sample noise
        z = torch.randn(imgs.shape[0], self.hparams.latent_dim)
        z = z.type_as(imgs)

        # train generator
        # generate images
        self.toggle_optimizer(optimizer_g)
        self.generated_imgs = self(z)

        # ground truth result (ie: all fake)
        valid = torch.ones(imgs.size(0), 1)
        valid = valid.type_as(imgs)

        # adversarial loss is binary cross-entropy
        g_loss = self.adversarial_loss(self.discriminator(self(z)), valid)
        self.log("g_loss", g_loss, prog_bar=True)
        self.manual_backward(g_loss)
        optimizer_g.step()
        optimizer_g.zero_grad()
        self.untoggle_optimizer(optimizer_g)

        # train discriminator
        # Measure discriminator's ability to classify real from generated samples
        self.toggle_optimizer(optimizer_d)

        # how well can it label as real?
        valid = torch.ones(imgs.size(0), 1)
        valid = valid.type_as(imgs)

        real_loss = self.adversarial_loss(self.discriminator(imgs), valid)

        # how well can it label as fake?
        fake = torch.zeros(imgs.size(0), 1)
        fake = fake.type_as(imgs)

        fake_loss = self.adversarial_loss(self.discriminator(self(z).detach()), fake)

        # discriminator loss is the average of these
        d_loss = (real_loss + fake_loss) / 2
        self.log("d_loss", d_loss, prog_bar=True)
        self.manual_backward(d_loss)
        optimizer_d.step()
        optimizer_d.zero_grad()
        self.untoggle_optimizer(optimizer_d)

    def configure_optimizers(self):
        lr = self.hparams.lr
        b1 = self.hparams.b1
        b2 = self.hparams.b2

        opt_g = torch.optim.Adam(self.generator.parameters(), lr=lr, betas=(b1, b2))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=lr, betas=(b1, b2))
        return [opt_g, opt_d], []

    def on_train_epoch_end(self):
        z = self.validation_z.type_as(self.generator.model[0].weight)

        # log sampled images
        sample_imgs = self(z)
        torch.save(sample_imgs.detach().cpu(),
                   os.path.join(self.hparams.samples_dir, f"generated_images_{self.current_epoch}.pt"))


def main():
    parser = argparse.ArgumentParser(description="Lightning GAN with manual optimization")
    parser.add_argument("--steps", type=int, default=20, help="training batches in total (one G and one D step each)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--epoch-batches", type=int, default=4, help="batches per epoch")
    args = parser.parse_args()

    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    L.seed_everything(args.seed)
    epochs = -(-args.steps // args.epoch_batches)
    dm = SyntheticDataModule(batch_size=args.batch_size, num_batches=args.epoch_batches, seed=args.seed)
    with tempfile.TemporaryDirectory() as root:
        model = GAN(*dm.dims, samples_dir=root)
        trainer = L.Trainer(
            accelerator="cpu",
            devices=1,
            max_epochs=epochs,
            max_steps=2 * args.steps,  # manual optimization counts every optimizer's step
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[ModelCheckpoint(dirpath=root)],
            default_root_dir=root,
        )
        trainer.fit(model, dm)


if __name__ == "__main__":
    main()
