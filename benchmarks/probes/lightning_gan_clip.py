"""Healthy probe: a Lightning GAN under manual optimization as in the Lightning docs' "Manual Optimization" page (automatic_optimization=False, opt_g, opt_d = self.optimizers(), self.toggle_optimizer / self.untoggle_optimizer around each half, self.manual_backward), with the discriminator updated first, both halves clipped by self.clip_gradients(opt, gradient_clip_val=..., gradient_clip_algorithm="norm"), a BatchNorm generator, per-epoch lr schedulers stepped by hand through self.lr_schedulers() in on_train_epoch_end, and a sampling pass without gradients in eval mode after fit.

Lightning counts each optimizer.step() in manual optimization, so max_steps=16 is 8
iterations of one discriminator and one generator update.
"""
import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

SEED, LATENT = 0, 8
L.seed_everything(SEED, verbose=False)


def two_moons(n, seed):
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(n, generator=g) * torch.pi
    upper = torch.rand(n, generator=g) < 0.5
    x = torch.where(upper, torch.cos(t), 1 - torch.cos(t))
    y = torch.where(upper, torch.sin(t), 0.5 - torch.sin(t))
    return torch.stack([x, y], 1) + 0.05 * torch.randn(n, 2, generator=g)


class GAN(L.LightningModule):
    def __init__(self, lr=2e-3, clip=1.0):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(LATENT, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 2))
        self.discriminator = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Dropout(0.1), nn.Linear(32, 1))

    def forward(self, z):
        return self.generator(z)

    def training_step(self, batch, batch_idx):
        (real,) = batch
        opt_g, opt_d = self.optimizers()
        z = torch.randn(real.size(0), LATENT, device=real.device)
        ones = torch.ones(real.size(0), 1, device=real.device)
        zeros = torch.zeros_like(ones)

        self.toggle_optimizer(opt_d)
        fake = self(z).detach()
        d_loss = 0.5 * (F.binary_cross_entropy_with_logits(self.discriminator(real), ones)
                        + F.binary_cross_entropy_with_logits(self.discriminator(fake), zeros))
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        self.clip_gradients(opt_d, gradient_clip_val=self.hparams.clip, gradient_clip_algorithm="norm")
        opt_d.step()
        self.untoggle_optimizer(opt_d)

        self.toggle_optimizer(opt_g)
        g_loss = F.binary_cross_entropy_with_logits(self.discriminator(self(z)), ones)
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        self.clip_gradients(opt_g, gradient_clip_val=self.hparams.clip, gradient_clip_algorithm="norm")
        opt_g.step()
        self.untoggle_optimizer(opt_g)
        self.log_dict({"d_loss": d_loss, "g_loss": g_loss}, prog_bar=True)

    def on_train_epoch_end(self):
        for sched in self.lr_schedulers():
            sched.step()

    def configure_optimizers(self):
        lr = self.hparams.lr
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=lr, betas=(0.5, 0.999))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=lr, betas=(0.5, 0.999))
        sched_g = torch.optim.lr_scheduler.ExponentialLR(opt_g, gamma=0.9)
        sched_d = torch.optim.lr_scheduler.ExponentialLR(opt_d, gamma=0.9)
        return [opt_g, opt_d], [sched_g, sched_d]


data = torch.utils.data.TensorDataset(two_moons(128, 1))
loader = torch.utils.data.DataLoader(data, batch_size=32, shuffle=True, drop_last=True)
model = GAN()
trainer = L.Trainer(max_steps=16, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, accelerator="cpu", devices=1)
trainer.fit(model, loader)
model.eval()
with torch.no_grad():
    samples = model(torch.randn(256, LATENT))
print(f"global_step {trainer.global_step} sample mean {samples.mean(0).tolist()} std {samples.std(0).tolist()}")
