"""Adversarial autoencoder for tabular data in PyTorch Lightning (manual optimization, 2 optimizers).

An encoder/decoder pair learns a 4-d code for 12 mixed-scale tabular features; after a
reconstruction-only warm-up a latent discriminator pushes the aggregated posterior towards a
Gaussian prior (AAE).  Manual optimization with two optimizers (autoencoder, discriminator);
the autoencoder learning rate follows a hand-written linear decay driven by `self.global_step`.

Modelled on: Lightning-AI/pytorch-lightning issue #17958 "incorrect global_step with multiple
optimizers and automatic_optimization=False" — with manual optimization every optimizer's
`.step()` increments `trainer.global_step`, so global_step-based logic ("logging, manual lr
schedulers, etc.") silently runs N times too fast once several optimizers step per batch
(PR #19589: "my model stopped training without me initially realizing why").

Unusual about the loop: during the warm-up only the autoencoder optimizer steps, so
global_step == number of autoencoder updates; once the discriminator starts stepping too, the
autoencoder LR decays twice as fast and reaches zero halfway through the adversarial phase.
--healthy: the schedule is driven by an explicit count of autoencoder updates.
"""
import sys

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv

N_FEAT, Z = 12, 4


def make_table(n, seed):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, 3, generator=g)
    mix = torch.randn(3, N_FEAT, generator=g)
    x = torch.tanh(z @ mix) + 0.05 * torch.randn(n, N_FEAT, generator=g)
    x[:, :3] = x[:, :3] * 5 + 10                      # a few large-scale "amount" columns
    x = (x - x.mean(0)) / x.std(0)
    return TensorDataset(x)


class TabularAAE(L.LightningModule):
    def __init__(self, lr=3e-3, warmup_batches=10, total_ae_steps=40, adv_weight=0.1):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.encoder = nn.Sequential(nn.Linear(N_FEAT, 64), nn.ReLU(), nn.Linear(64, Z))
        self.decoder = nn.Sequential(nn.Linear(Z, 64), nn.ReLU(), nn.Linear(64, N_FEAT))
        self.disc = nn.Sequential(nn.Linear(Z, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
        self.ae_updates = 0
        self.lr_trace = []

    def configure_optimizers(self):
        ae = torch.optim.Adam(list(self.encoder.parameters()) + list(self.decoder.parameters()),
                              lr=self.hparams.lr)
        d = torch.optim.Adam(self.disc.parameters(), lr=1e-3, betas=(0.5, 0.9))
        return ae, d

    def ae_lr(self):
        step = self.ae_updates if HEALTHY else self.global_step
        return self.hparams.lr * max(0.0, 1.0 - step / self.hparams.total_ae_steps)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        opt_ae, opt_d = self.optimizers()
        adversarial = self.ae_updates >= self.hparams.warmup_batches

        if adversarial:
            if not HEALTHY and self.ae_updates == self.hparams.warmup_batches:
                print(f"ONSET step {self.ae_updates}")
            z_fake = self.encoder(x).detach()
            z_real = torch.randn_like(z_fake)
            d_loss = F.binary_cross_entropy_with_logits(self.disc(z_real), torch.ones(len(x), 1)) + \
                F.binary_cross_entropy_with_logits(self.disc(z_fake), torch.zeros(len(x), 1))
            opt_d.zero_grad()
            self.manual_backward(d_loss)
            opt_d.step()

        z = self.encoder(x)
        recon = F.mse_loss(self.decoder(z), x)
        loss = recon
        if adversarial:
            loss = loss + self.hparams.adv_weight * F.binary_cross_entropy_with_logits(
                self.disc(z), torch.ones(len(x), 1))
        lr = self.ae_lr()
        for group in opt_ae.param_groups:
            group["lr"] = lr
        opt_ae.zero_grad()
        self.manual_backward(loss)
        opt_ae.step()
        self.lr_trace.append(lr)
        print(f"ae_step {self.ae_updates:3d} global_step {self.global_step:3d} recon {recon.item():.4f} lr {lr:.5f}")
        self.ae_updates += 1


def main():
    L.seed_everything(0, verbose=False)
    loader = DataLoader(make_table(640, 1), batch_size=64, shuffle=True)
    model = TabularAAE()
    trainer = L.Trainer(max_epochs=4, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader)
    with torch.no_grad():
        x = make_table(640, 1).tensors[0]
        recon = F.mse_loss(model.decoder(model.encoder(x)), x).item()
    dead = sum(1 for lr in model.lr_trace if lr == 0.0)
    print(f"EVIDENCE ae_updates_with_lr_zero={dead}/{len(model.lr_trace)} final_ae_lr={model.lr_trace[-1]:.5f} "
          f"trainer_global_step={trainer.global_step} full_data_recon_mse={recon:.4f}")


if __name__ == "__main__":
    main()
