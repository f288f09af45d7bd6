"""WGAN-GP on the 8-Gaussians toy distribution with Lightning manual optimization.

Modelled on igul222/improved_wgan_training gan_toy.py (8 Gaussians, ReLU MLPs, critic
trained 5 times per generator step, gradient penalty lambda=10 on random interpolates,
Adam(lr=1e-4, betas=(0.5, 0.9))) written as a LightningModule the way the Lightning docs
"Manual Optimization" page shows for GANs (automatic_optimization=False, self.optimizers(),
self.manual_backward, toggle_optimizer/untoggle_optimizer).

Unusual loop: the penalty term differentiates the critic's input-gradient norm, so the
critic's backward goes through a graph built with create_graph=True (double backward);
there are two optimizers and the generator one steps only on every fifth batch, while the
critic's parameters are toggled off (requires_grad False) during the generator step.
"""
import math
import warnings

import lightning.pytorch as pl
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
warnings.filterwarnings("ignore")

CENTERS = torch.tensor([(math.cos(a), math.sin(a)) for a in torch.arange(8) * math.pi / 4]) * 2.0


def sample_real(n, g):
    c = CENTERS[torch.randint(0, 8, (n,), generator=g)]
    return c + 0.05 * torch.randn(n, 2, generator=g)


def mlp(inp, out, hid=128):
    return nn.Sequential(nn.Linear(inp, hid), nn.ReLU(), nn.Linear(hid, hid), nn.ReLU(),
                         nn.Linear(hid, hid), nn.ReLU(), nn.Linear(hid, out))


class WGANGP(pl.LightningModule):
    def __init__(self, z_dim=2, n_critic=5, gp_lambda=10.0):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.gen = mlp(z_dim, 2)
        self.critic = mlp(2, 1)
        self.history = []

    def gradient_penalty(self, real, fake):
        eps = torch.rand(real.size(0), 1)
        interp = (eps * real + (1 - eps) * fake).requires_grad_(True)
        out = self.critic(interp)
        grads, = torch.autograd.grad(out.sum(), interp, create_graph=True)
        return ((grads.norm(2, dim=1) - 1) ** 2).mean()

    def training_step(self, batch, batch_idx):
        real, = batch
        opt_g, opt_c = self.optimizers()

        # critic step on every batch
        self.toggle_optimizer(opt_c)
        z = torch.randn(real.size(0), self.hparams.z_dim)
        fake = self.gen(z).detach()
        w_est = self.critic(real).mean() - self.critic(fake).mean()
        gp = self.gradient_penalty(real, fake)
        c_loss = -w_est + self.hparams.gp_lambda * gp
        opt_c.zero_grad()
        self.manual_backward(c_loss)
        opt_c.step()
        self.untoggle_optimizer(opt_c)

        # generator step every n_critic batches
        if (batch_idx + 1) % self.hparams.n_critic == 0:
            self.toggle_optimizer(opt_g)
            z = torch.randn(real.size(0), self.hparams.z_dim)
            g_loss = -self.critic(self.gen(z)).mean()
            opt_g.zero_grad()
            self.manual_backward(g_loss)
            opt_g.step()
            self.untoggle_optimizer(opt_g)
        self.history.append(c_loss.item())

    def configure_optimizers(self):
        opt_g = torch.optim.Adam(self.gen.parameters(), lr=1e-4, betas=(0.5, 0.9))
        opt_c = torch.optim.Adam(self.critic.parameters(), lr=1e-4, betas=(0.5, 0.9))
        return [opt_g, opt_c]


@torch.no_grad()
def mode_distance(gen, n=2000):
    """Mean distance of generated points to their nearest Gaussian centre."""
    pts = gen(torch.randn(n, 2, generator=torch.Generator().manual_seed(9)))
    return torch.cdist(pts, CENTERS).min(1).values.mean().item()


pl.seed_everything(0, verbose=False)
real = sample_real(256 * 300, torch.Generator().manual_seed(1))
loader = DataLoader(TensorDataset(real), batch_size=256, shuffle=True)
model = WGANGP()
before = mode_distance(model.gen)
trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model, loader)
h = model.history
print(f"critic steps {len(h)}, generator steps {len(h) // model.hparams.n_critic}")
print("critic loss (-W + 10 GP) by 50 batches:", [round(sum(h[i:i + 50]) / 50, 3) for i in range(0, len(h), 50)])
print(f"mean distance to nearest mode: before {before:.3f} after {mode_distance(model.gen):.3f}")
