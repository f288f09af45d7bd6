"""A GAN on 2-D points trained with Lightning's manual optimization.

Modelled on: the Lightning docs' "Manual Optimization" page and the lightning-tutorials
"PyTorch Lightning Basic GAN Tutorial" (Lightning-AI/tutorials
lightning_examples/basic-gan).  Habits reproduced: ``self.automatic_optimization =
False``; ``opt_g, opt_d = self.optimizers()``; ``self.toggle_optimizer`` /
``self.untoggle_optimizer`` around each half; ``self.manual_backward``; Adam with
``betas=(0.5, 0.999)``; the generator step first with "real" labels built with
``type_as``; the discriminator on ``fake.detach()``; ``self.log_dict``; sample generation
under ``torch.no_grad`` at each epoch end.

Lightning counts every ``optimizer.step()`` towards ``global_step`` in manual
optimization, so ``--steps N`` (training iterations, each one generator and one
discriminator step) becomes ``max_steps=2N``.
"""

import argparse

import lightning.pytorch as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def ring_of_gaussians(n, seed):
    g = torch.Generator().manual_seed(seed)
    angles = torch.randint(0, 8, (n,), generator=g).float() * (2 * torch.pi / 8)
    centres = torch.stack([torch.cos(angles), torch.sin(angles)], dim=1) * 2.0
    return centres + 0.05 * torch.randn(n, 2, generator=g)


class Generator(nn.Module):
    def __init__(self, latent_dim, hidden=64):
        super().__init__()
        self.model = nn.Sequential(
            nn.Linear(latent_dim, hidden), nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(hidden, hidden), nn.BatchNorm1d(hidden), nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(hidden, 2),
        )

    def forward(self, z):
        return self.model(z)


class Discriminator(nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.model = nn.Sequential(
            nn.Linear(2, hidden), nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(hidden, hidden), nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(hidden, 1),
        )

    def forward(self, x):
        return self.model(x)


class GAN(pl.LightningModule):
    def __init__(self, latent_dim: int = 8, lr: float = 2e-4, b1: float = 0.5, b2: float = 0.999):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = Generator(latent_dim)
        self.discriminator = Discriminator()
        self.validation_z = torch.randn(16, latent_dim)

    def forward(self, z):
        return self.generator(z)

    def adversarial_loss(self, y_hat, y):
        return F.binary_cross_entropy_with_logits(y_hat, y)

    def training_step(self, batch):
        (points,) = batch
        opt_g, opt_d = self.optimizers()

        z = torch.randn(points.shape[0], self.hparams.latent_dim).type_as(points)

        # train generator
        self.toggle_optimizer(opt_g)
        self.generated = self(z)
        valid = torch.ones(points.size(0), 1).type_as(points)
        g_loss = self.adversarial_loss(self.discriminator(self.generated), valid)
        self.manual_backward(g_loss)
        opt_g.step()
        opt_g.zero_grad()
        self.untoggle_optimizer(opt_g)

        # train discriminator
        self.toggle_optimizer(opt_d)
        valid = torch.ones(points.size(0), 1).type_as(points)
        real_loss = self.adversarial_loss(self.discriminator(points), valid)
        fake = torch.zeros(points.size(0), 1).type_as(points)
        fake_loss = self.adversarial_loss(self.discriminator(self.generated.detach()), fake)
        d_loss = (real_loss + fake_loss) / 2
        self.manual_backward(d_loss)
        opt_d.step()
        opt_d.zero_grad()
        self.untoggle_optimizer(opt_d)

        self.log_dict({"g_loss": g_loss, "d_loss": d_loss}, prog_bar=True)

    def configure_optimizers(self):
        lr, b1, b2 = self.hparams.lr, self.hparams.b1, self.hparams.b2
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=lr, betas=(b1, b2))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=lr, betas=(b1, b2))
        return [opt_g, opt_d]

    def on_train_epoch_end(self):
        z = self.validation_z.type_as(self.generator.model[0].weight)
        self.generator.eval()
        with torch.no_grad():
            samples = self(z)
        self.generator.train()
        radius = samples.norm(dim=1).mean().item()
        print(f"epoch {self.current_epoch}: mean sample radius {radius:.3f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60, help="training iterations (G step + D step)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    pl.seed_everything(args.seed, verbose=False)
    loader = DataLoader(TensorDataset(ring_of_gaussians(160, args.seed)), batch_size=args.batch_size,
                        shuffle=True, drop_last=True)
    model = GAN()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=2 * args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, loader)
    print(f"finished: global_step={trainer.global_step} epochs={trainer.current_epoch}")


if __name__ == "__main__":
    main()
