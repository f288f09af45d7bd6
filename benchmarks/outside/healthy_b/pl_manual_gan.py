"""Modelled on the Lightning tutorial 'PyTorch Lightning Basic GAN Tutorial'
(Lightning-AI/tutorials lightning_examples/basic-gan) with manual optimization as in the
Lightning docs 'Manual Optimization' (automatic_optimization=False, self.optimizers(),
toggle_optimizer/untoggle_optimizer, manual_backward, lr_schedulers() stepped at epoch end).
1-D 'images' (16-dim vectors from a 2-component mixture) instead of MNIST."""
import torch, torch.nn as nn, torch.nn.functional as F
import lightning as L
from torch.utils.data import TensorDataset, DataLoader
L.seed_everything(0)
D, Z = 16, 8
def real_data(n):
    g = torch.Generator().manual_seed(0)
    base = torch.stack([torch.sin(torch.linspace(0, 3, D)), torch.cos(torch.linspace(0, 3, D))])
    return TensorDataset(base[torch.randint(0, 2, (n,), generator=g)] + 0.1 * torch.randn(n, D, generator=g))
class GAN(L.LightningModule):
    def __init__(self, lr=2e-3, b1=0.5, b2=0.999):
        super().__init__(); self.save_hyperparameters(); self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(Z, 64), nn.BatchNorm1d(64), nn.LeakyReLU(0.2), nn.Linear(64, D), nn.Tanh())
        self.discriminator = nn.Sequential(nn.Linear(D, 64), nn.LeakyReLU(0.2), nn.Dropout(0.2), nn.Linear(64, 1))
        self.validation_z = torch.randn(32, Z)
    def forward(self, z): return self.generator(z)
    def training_step(self, batch, batch_idx):
        (x,) = batch; opt_g, opt_d = self.optimizers()
        z = torch.randn(x.size(0), Z).type_as(x)
        self.toggle_optimizer(opt_g)
        g_loss = F.binary_cross_entropy_with_logits(self.discriminator(self(z)), torch.ones(x.size(0), 1).type_as(x))
        opt_g.zero_grad(); self.manual_backward(g_loss); opt_g.step()
        self.untoggle_optimizer(opt_g)
        self.toggle_optimizer(opt_d)
        real = F.binary_cross_entropy_with_logits(self.discriminator(x), torch.ones(x.size(0), 1).type_as(x))
        fake = F.binary_cross_entropy_with_logits(self.discriminator(self(z).detach()), torch.zeros(x.size(0), 1).type_as(x))
        d_loss = (real + fake) / 2
        opt_d.zero_grad(); self.manual_backward(d_loss); self.clip_gradients(opt_d, gradient_clip_val=1.0); opt_d.step()
        self.untoggle_optimizer(opt_d)
        self.log_dict({"g_loss": g_loss, "d_loss": d_loss}, prog_bar=True)
    def on_train_epoch_end(self):
        for s in self.lr_schedulers(): s.step()
    def validation_step(self, batch, batch_idx):
        (x,) = batch
        fake = self(self.validation_z.type_as(x))
        self.log("val_mmd", (fake.mean(0) - x.mean(0)).pow(2).sum())
    def configure_optimizers(self):
        lr, b1, b2 = self.hparams.lr, self.hparams.b1, self.hparams.b2
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=lr, betas=(b1, b2))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=lr, betas=(b1, b2))
        return [opt_g, opt_d], [torch.optim.lr_scheduler.StepLR(opt_g, 1, 0.7), torch.optim.lr_scheduler.StepLR(opt_d, 1, 0.7)]
trainer = L.Trainer(max_epochs=3, accelerator="cpu", devices=1, enable_progress_bar=False, logger=False,
                    enable_checkpointing=False, log_every_n_steps=5)
trainer.fit(GAN(), DataLoader(real_data(320), batch_size=32, shuffle=True), DataLoader(real_data(64), batch_size=64))
