"""Tabular regression (house-price style features, log-price target) with a
residual MLP in PyTorch Lightning; the learning-rate schedule is a step decay
whose milestones are given in optimizer steps.

Modelled on: Lightning-AI/pytorch-lightning#5631 "lr_scheduler step() called
after every epoch instead of after every batch": the user returned a
per-iteration scheduler from ``configure_optimizers`` without an
``"interval": "step"`` entry, so Lightning used its default
``interval="epoch"`` and stepped it once per epoch; the answer was to add
``"interval": "step"`` to the lr_scheduler config.  Here the milestones
(15 and 30) are optimizer-step indices computed from the length of the
dataloader, so with the default interval the decay is never applied within
the 4-epoch run -- training silently keeps the peak learning rate.

Unusual about the loop: LightningDataModule with a validation split, feature
standardisation computed in ``setup`` from the training split only, Huber
loss, AdamW with decoupled weight decay, a Callback that records the
learning rate of every batch.
Run: python p12_lightning_tabular_step_milestones_interval.py [--healthy]
"""
import argparse
import logging

import lightning.pytorch as pl
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)


class HousingDataModule(pl.LightningDataModule):
    def __init__(self, n=2000, batch_size=128):
        super().__init__()
        self.n, self.batch_size = n, batch_size

    def setup(self, stage=None):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(self.n, 12, generator=g) * torch.linspace(0.5, 3, 12) + torch.linspace(-1, 4, 12)
        w = torch.randn(12, generator=g)
        y = 12 + 0.3 * torch.tanh(x @ w / 4) + 0.1 * (x[:, 0] * x[:, 3]).clamp(-3, 3) \
            + 0.05 * torch.randn(self.n, generator=g)
        n_train = int(0.8 * self.n)
        self.mean, self.std = x[:n_train].mean(0), x[:n_train].std(0)
        x = (x - self.mean) / self.std
        self.train_ds = torch.utils.data.TensorDataset(x[:n_train], y[:n_train])
        self.val_ds = torch.utils.data.TensorDataset(x[n_train:], y[n_train:])

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.train_ds, batch_size=self.batch_size, shuffle=True,
                                           generator=torch.Generator().manual_seed(1))

    def val_dataloader(self):
        return torch.utils.data.DataLoader(self.val_ds, batch_size=512)


class ResMLPRegressor(pl.LightningModule):
    def __init__(self, milestones, healthy, lr=3e-3):
        super().__init__()
        self.save_hyperparameters()
        self.inp = nn.Linear(12, 128)
        self.blocks = nn.ModuleList([nn.Sequential(nn.LayerNorm(128), nn.Linear(128, 128), nn.GELU(),
                                                   nn.Dropout(0.1)) for _ in range(2)])
        self.out = nn.Linear(128, 1)
        self.val_rmse = []

    def forward(self, x):
        h = self.inp(x)
        for blk in self.blocks:
            h = h + blk(h)
        return self.out(h).squeeze(-1) + 12.0

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.huber_loss(self(x), y, delta=0.5)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.val_rmse.append(F.mse_loss(self(x), y).sqrt().item())

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=1e-4)
        sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=self.hparams.milestones, gamma=0.1)
        sched_cfg = {"scheduler": sched}
        if self.hparams.healthy:
            sched_cfg["interval"] = "step"
        return {"optimizer": opt, "lr_scheduler": sched_cfg}


class LRRecorder(pl.Callback):
    def __init__(self, first_milestone, healthy):
        self.lrs, self.first_milestone, self.healthy = [], first_milestone, healthy

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        step = trainer.global_step
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])
        if step == self.first_milestone and not self.healthy:
            print(f"ONSET step {step}")
        if step % 12 == 0:
            print(f"step {step:3d} lr {self.lrs[-1]:.2e}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--healthy", action="store_true")
    args = parser.parse_args()
    pl.seed_everything(0, verbose=False)
    dm = HousingDataModule()
    steps_per_epoch, epochs = 13, 4           # 1600 rows / 128
    total = steps_per_epoch * epochs
    milestones = [int(0.3 * total), int(0.6 * total)]
    model = ResMLPRegressor(milestones, args.healthy)
    rec = LRRecorder(milestones[0], args.healthy)
    trainer = pl.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[rec], num_sanity_val_steps=0)
    trainer.fit(model, datamodule=dm)
    print(f"EVIDENCE lr at step {milestones[0]}={rec.lrs[milestones[0]]:.2e} | lr at last step "
          f"{len(rec.lrs) - 1}={rec.lrs[-1]:.2e} | final val RMSE={model.val_rmse[-1]:.4f}")


if __name__ == "__main__":
    main()
