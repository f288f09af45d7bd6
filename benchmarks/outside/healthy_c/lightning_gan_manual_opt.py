"""Modelled on the Lightning docs "Manual Optimization" page (SimpleGAN example:
automatic_optimization = False, self.optimizers(), self.manual_backward, toggle/untoggle
optimizer, manually stepped LR schedulers) and the Lightning basic-GAN tutorial.

GAN on the classic 2-D ring of 8 Gaussians.  The discriminator uses the
torch.nn.utils.parametrizations.spectral_norm parametrization (weight recomputed from
parametrization.original + power-iteration buffers).  Two Adam optimizers (betas 0.5, 0.999),
two StepLR schedulers stepped by hand on epoch end, validation_step computing an RBF-MMD
between generated and real samples, ModelCheckpoint on the validation metric, then the best
checkpoint is reloaded with load_from_checkpoint."""
import math
import torch
import torch.nn as nn
import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.nn.utils.parametrizations import spectral_norm

L.seed_everything(0)

def eight_gaussians(n, g):
    centers = torch.tensor([(math.cos(2 * math.pi * k / 8), math.sin(2 * math.pi * k / 8)) for k in range(8)]) * 2.0
    idx = torch.randint(0, 8, (n,), generator=g)
    return centers[idx] + 0.05 * torch.randn(n, 2, generator=g)

g = torch.Generator().manual_seed(0)
train_data, val_data = eight_gaussians(2048, g), eight_gaussians(512, g)
train_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(train_data), batch_size=128, shuffle=True)
val_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(val_data), batch_size=512)

class Generator(nn.Module):
    def __init__(self, latent_dim=8):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(latent_dim, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                                 nn.Linear(128, 2))
    def forward(self, z):
        return self.net(z)

class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(spectral_norm(nn.Linear(2, 128)), nn.LeakyReLU(0.2),
                                 spectral_norm(nn.Linear(128, 128)), nn.LeakyReLU(0.2),
                                 spectral_norm(nn.Linear(128, 1)))
    def forward(self, x):
        return self.net(x)

def rbf_mmd(x, y, sigma=0.5):
    def k(a, b):
        return torch.exp(-torch.cdist(a, b) ** 2 / (2 * sigma ** 2))
    return k(x, x).mean() + k(y, y).mean() - 2 * k(x, y).mean()

class SimpleGAN(L.LightningModule):
    def __init__(self, latent_dim=8, lr=2e-3):
        super().__init__()
        self.save_hyperparameters()
        self.G = Generator(latent_dim)
        self.D = Discriminator()
        self.automatic_optimization = False
        self.criterion = nn.BCEWithLogitsLoss()

    def sample_G(self, n):
        z = torch.randn(n, self.hparams.latent_dim, device=self.device)
        return self.G(z)

    def training_step(self, batch, batch_idx):
        g_opt, d_opt = self.optimizers()
        (X,) = batch
        batch_size = X.shape[0]
        real_label = torch.ones((batch_size, 1), device=self.device)
        fake_label = torch.zeros((batch_size, 1), device=self.device)
        g_X = self.sample_G(batch_size)

        # ---- Optimize Discriminator ----
        self.toggle_optimizer(d_opt)
        d_x = self.D(X)
        errD_real = self.criterion(d_x, real_label)
        d_z = self.D(g_X.detach())
        errD_fake = self.criterion(d_z, fake_label)
        errD = errD_real + errD_fake
        d_opt.zero_grad()
        self.manual_backward(errD)
        d_opt.step()
        self.untoggle_optimizer(d_opt)

        # ---- Optimize Generator ----
        self.toggle_optimizer(g_opt)
        d_z = self.D(g_X)
        errG = self.criterion(d_z, real_label)
        g_opt.zero_grad()
        self.manual_backward(errG)
        self.clip_gradients(g_opt, gradient_clip_val=5.0, gradient_clip_algorithm="norm")
        g_opt.step()
        self.untoggle_optimizer(g_opt)

        self.log_dict({"g_loss": errG, "d_loss": errD}, prog_bar=True)

    def on_train_epoch_end(self):
        g_sch, d_sch = self.lr_schedulers()
        g_sch.step()
        d_sch.step()

    def validation_step(self, batch, batch_idx):
        (X,) = batch
        fake = self.sample_G(X.shape[0])
        mmd = rbf_mmd(fake, X)
        self.log("val_mmd", mmd, prog_bar=True)
        return mmd

    def configure_optimizers(self):
        lr = self.hparams.lr
        g_opt = torch.optim.Adam(self.G.parameters(), lr=lr, betas=(0.5, 0.999))
        d_opt = torch.optim.Adam(self.D.parameters(), lr=lr, betas=(0.5, 0.999))
        g_sch = torch.optim.lr_scheduler.StepLR(g_opt, step_size=1, gamma=0.7)
        d_sch = torch.optim.lr_scheduler.StepLR(d_opt, step_size=1, gamma=0.7)
        return [g_opt, d_opt], [g_sch, d_sch]

model = SimpleGAN()
ckpt_cb = ModelCheckpoint(dirpath="out/lightning_gan", monitor="val_mmd", mode="min", save_top_k=1,
                          filename="gan-{epoch}-{val_mmd:.4f}")
trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=3, logger=False, enable_progress_bar=False,
                    enable_checkpointing=True, callbacks=[ckpt_cb], num_sanity_val_steps=0,
                    enable_model_summary=False)
trainer.fit(model, train_loader, val_loader)          # 3 epochs x 16 batches, each a D and a G step
print("best checkpoint:", ckpt_cb.best_model_path, "val_mmd", float(ckpt_cb.best_model_score))
print("per-epoch metrics:", {k: float(v) for k, v in trainer.callback_metrics.items()})

best = SimpleGAN.load_from_checkpoint(ckpt_cb.best_model_path)
best.eval()
with torch.no_grad():
    samples = best.sample_G(1000)
    print("reloaded generator MMD vs val:", rbf_mmd(samples, val_data).item())
