"""WGAN-GP on the "8 gaussians" toy distribution as a LightningModule with manual optimisation.

Modelled on: Lightning-AI/pytorch-lightning examples/pytorch/domain_templates/
generative_adversarial_net.py (GAN LightningModule with two optimizers, toggle_optimizer,
manual_backward) and igul222/improved_wgan_training gan_toy.py (8-gaussians data, critic
iterations = 5, gradient penalty, Adam(betas=(0.5, 0.9))).

Unusual but intended:
  * automatic_optimization = False: two optimizers step at different rates (the critic on
    every batch, the generator on every 5th batch), so the generator's parameters receive
    no gradient on most steps;
  * the gradient penalty differentiates the critic's input gradient norm, i.e. a
    torch.autograd.grad(..., create_graph=True) double backward inside the training step;
  * the generator's linear layers use weight normalisation via
    torch.nn.utils.parametrizations.weight_norm;
  * the critic has no normalisation layers and its loss is unbounded/signed (Wasserstein
    estimate), so a negative, growing-then-shrinking loss is expected.
"""
import math

import lightning as L
import torch
import torch.nn as nn
from torch.nn.utils.parametrizations import weight_norm
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)


def eight_gaussians(n, gen, scale=2.0, std=0.02):
    centers = torch.tensor([(math.cos(a), math.sin(a)) for a in torch.arange(8) * math.pi / 4]) * scale
    idx = torch.randint(0, 8, (n,), generator=gen)
    return (centers[idx] + std * torch.randn(n, 2, generator=gen)) / 1.414, centers / 1.414


class Generator(nn.Module):
    def __init__(self, latent_dim=2, hidden=256):
        super().__init__()
        self.net = nn.Sequential(
            weight_norm(nn.Linear(latent_dim, hidden)), nn.ReLU(),
            weight_norm(nn.Linear(hidden, hidden)), nn.ReLU(),
            weight_norm(nn.Linear(hidden, hidden)), nn.ReLU(),
            nn.Linear(hidden, 2),
        )

    def forward(self, z):
        return self.net(z)


class Critic(nn.Module):
    def __init__(self, hidden=256):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


class WGANGP(L.LightningModule):
    def __init__(self, latent_dim=2, lr=5e-4, n_critic=5, gp_lambda=1.0):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = Generator(latent_dim)
        self.critic = Critic()
        self.register_buffer("modes", eight_gaussians(1, torch.Generator().manual_seed(0))[1])

    def gradient_penalty(self, real, fake):
        eps = torch.rand(real.shape[0], 1, device=real.device)
        interp = (eps * real + (1 - eps) * fake).requires_grad_(True)
        out = self.critic(interp)
        grads, = torch.autograd.grad(out.sum(), interp, create_graph=True)
        return ((grads.norm(2, dim=1) - 1) ** 2).mean()

    def training_step(self, batch, batch_idx):
        real, = batch
        opt_g, opt_d = self.optimizers()
        z = torch.randn(real.shape[0], self.hparams.latent_dim, device=real.device)

        # ---- critic: every batch ----
        self.toggle_optimizer(opt_d)
        fake = self.generator(z).detach()
        w_dist = self.critic(real).mean() - self.critic(fake).mean()
        gp = self.gradient_penalty(real, fake)
        d_loss = -w_dist + self.hparams.gp_lambda * gp
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        self.untoggle_optimizer(opt_d)
        self.log_dict({"d_loss": d_loss, "w_dist": w_dist, "gp": gp}, prog_bar=False)

        # ---- generator: every n_critic batches ----
        if (batch_idx + 1) % self.hparams.n_critic == 0:
            self.toggle_optimizer(opt_g)
            g_loss = -self.critic(self.generator(z)).mean()
            opt_g.zero_grad()
            self.manual_backward(g_loss)
            opt_g.step()
            self.untoggle_optimizer(opt_g)
            self.log("g_loss", g_loss)

        if batch_idx % 10 == 0:
            print(f"epoch {self.current_epoch} batch {batch_idx:2d} d_loss {d_loss.item():+.4f} "
                  f"W {w_dist.item():+.4f} gp {gp.item():.4f}")

    def validation_step(self, batch, batch_idx):
        real, = batch
        g = torch.Generator().manual_seed(123)
        z = torch.randn(real.shape[0], self.hparams.latent_dim, generator=g).to(real.device)
        fake = self.generator(z)
        d = torch.cdist(fake, self.modes).min(1).values  # distance of samples to the nearest mode
        self.log("val_mode_dist", d.mean())

    def on_validation_epoch_end(self):
        print(f"  validation after epoch {self.current_epoch}: "
              f"mean distance to nearest mode {self.trainer.callback_metrics['val_mode_dist']:.4f}")

    def configure_optimizers(self):
        lr, betas = self.hparams.lr, (0.5, 0.9)
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=lr, betas=betas)
        opt_d = torch.optim.Adam(self.critic.parameters(), lr=lr, betas=betas)
        return [opt_g, opt_d]


def main():
    L.seed_everything(0, workers=True)
    gen = torch.Generator().manual_seed(0)
    train = TensorDataset(eight_gaussians(30 * 256, gen)[0])
    val = TensorDataset(eight_gaussians(1024, gen)[0])
    model = WGANGP()
    trainer = L.Trainer(accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, DataLoader(train, batch_size=256, shuffle=True), DataLoader(val, batch_size=1024))


if __name__ == "__main__":
    main()
