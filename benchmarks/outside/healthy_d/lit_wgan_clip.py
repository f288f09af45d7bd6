"""Modelled on the Lightning tutorial "PyTorch Lightning Basic GAN Tutorial"
(manual optimization with two optimizers, toggle_optimizer / manual_backward) with the WGAN
training rule of eriklindernoren/PyTorch-GAN implementations/wgan/wgan.py (RMSprop,
n_critic=5, weight clipping to [-clip_value, clip_value] after every critic step).

Exercises: automatic_optimization=False with a generator and a critic in one LightningModule;
the generator optimizer steps only once per n_critic batches (so most batches update only
the critic); critic weights are clamped in place after each critic step; fake samples are
detached for the critic step; a fixed latent batch is used for an on_train_epoch_end
"sample" check. Synthetic data: a ring of 8 Gaussians in 2-D.
"""
import math
import torch
import torch.nn as nn
import lightning as L

torch.set_num_threads(1)
L.seed_everything(0)


def ring_of_gaussians(n, gen):
    k = torch.randint(0, 8, (n,), generator=gen)
    ang = k.float() * 2 * math.pi / 8
    centers = torch.stack([torch.cos(ang), torch.sin(ang)], 1) * 2.0
    return centers + 0.05 * torch.randn(n, 2, generator=gen)


class Generator(nn.Module):
    def __init__(self, latent_dim=8):
        super().__init__()
        self.model = nn.Sequential(nn.Linear(latent_dim, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))

    def forward(self, z):
        return self.model(z)


class Critic(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.Sequential(nn.Linear(2, 64), nn.LeakyReLU(0.2), nn.Linear(64, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1))

    def forward(self, x):
        return self.model(x)


class WGAN(L.LightningModule):
    def __init__(self, latent_dim=8, lr=5e-4, n_critic=5, clip_value=0.05):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = Generator(latent_dim)
        self.critic = Critic()
        self.validation_z = torch.randn(256, latent_dim)

    def forward(self, z):
        return self.generator(z)

    def training_step(self, batch, batch_idx):
        (real,) = batch
        opt_g, opt_d = self.optimizers()
        z = torch.randn(real.shape[0], self.hparams.latent_dim).type_as(real)

        # ---------------------  Train Critic ---------------------
        self.toggle_optimizer(opt_d)
        fake = self(z).detach()
        loss_d = -torch.mean(self.critic(real)) + torch.mean(self.critic(fake))
        self.manual_backward(loss_d)
        opt_d.step()
        opt_d.zero_grad()
        self.untoggle_optimizer(opt_d)
        # Clip weights of discriminator
        for p in self.critic.parameters():
            p.data.clamp_(-self.hparams.clip_value, self.hparams.clip_value)
        self.log("d_loss", loss_d, prog_bar=True)

        # Train the generator every n_critic iterations
        if batch_idx % self.hparams.n_critic == 0:
            self.toggle_optimizer(opt_g)
            gen = self(z)
            loss_g = -torch.mean(self.critic(gen))
            self.manual_backward(loss_g)
            opt_g.step()
            opt_g.zero_grad()
            self.untoggle_optimizer(opt_g)
            self.log("g_loss", loss_g, prog_bar=True)

    def configure_optimizers(self):
        opt_g = torch.optim.RMSprop(self.generator.parameters(), lr=self.hparams.lr)
        opt_d = torch.optim.RMSprop(self.critic.parameters(), lr=self.hparams.lr)
        return [opt_g, opt_d]

    def on_train_epoch_end(self):
        with torch.no_grad():
            samples = self(self.validation_z.type_as(self.generator.model[0].weight))
        r = samples.norm(dim=1)
        print(f"epoch {self.current_epoch}: sample radius mean {r.mean():.3f} std {r.std():.3f} "
              f"d_loss {self.trainer.callback_metrics['d_loss']:.4f}")


gen = torch.Generator().manual_seed(0)
dataset = torch.utils.data.TensorDataset(ring_of_gaussians(64 * 25, gen))
loader = torch.utils.data.DataLoader(dataset, batch_size=64, shuffle=True, num_workers=0)
model = WGAN()
trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_progress_bar=False,
                    enable_checkpointing=False, enable_model_summary=False)
trainer.fit(model, loader)
print("optimizer steps (critic + generator):", trainer.global_step)
