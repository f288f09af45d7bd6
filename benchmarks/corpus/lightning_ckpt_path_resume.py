"""A Lightning MLP regressor whose fit is preempted twice and resumed with ``trainer.fit(model, ckpt_path=...)``.

Modelled on: the Lightning docs "Saving and loading checkpoints" and ``Trainer.fit(ckpt_path=...)``
(https://lightning.ai/docs/pytorch/stable/common/checkpointing_basic.html,
https://lightning.ai/docs/pytorch/stable/common/checkpointing_intermediate.html)
Habits reproduced: a ``LightningModule`` with ``save_hyperparameters()``, ``training_step`` returning the
loss, a ``validation_step`` that ``self.log``s ``val_loss`` once per epoch, and ``configure_optimizers``
returning Adam with a ``StepLR`` under ``{"interval": "step"}``; ``ModelCheckpoint(dirpath=...,
every_n_train_steps=k, save_top_k=-1)``; a first ``Trainer(max_steps=...)`` fit, then for each restart a
fresh model and a fresh ``Trainer`` whose ``max_steps`` is the new absolute target, with
``trainer.fit(model, ckpt_path=<latest checkpoint>)`` restoring weights, optimizer, scheduler and loop
progress; a dataloader implementing ``state_dict``/``load_state_dict`` so a mid-epoch resume skips the
batches already consumed, and a sampler with ``set_epoch`` (called by the Trainer) so each epoch's
shuffle is reproducible.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import warnings

import lightning.pytorch as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, Sampler, TensorDataset

warnings.filterwarnings("ignore", ".*does not have many workers.*")
warnings.filterwarnings("ignore", ".*exists and is not empty.*")
logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)


class EpochShuffleSampler(Sampler):
    """A random order that depends only on (seed, epoch); the Trainer calls ``set_epoch`` each epoch."""

    def __init__(self, num_samples, seed):
        self.num_samples, self.seed, self.epoch = num_samples, seed, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.num_samples

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.num_samples, generator=generator).tolist())


class ResumableDataLoader(DataLoader):
    """Remembers how many batches of the current epoch were handed out, so a restart can skip them."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches_yielded = 0

    def __iter__(self):
        # The Trainer stops pulling after len(self) batches, so a full count means a new epoch.
        skip = self.batches_yielded if self.batches_yielded < len(self) else 0
        self.batches_yielded = 0
        for i, batch in enumerate(super().__iter__()):
            if i < skip:
                continue
            self.batches_yielded = i + 1
            yield batch

    def state_dict(self):
        return {"batches_yielded": self.batches_yielded}

    def load_state_dict(self, state_dict):
        self.batches_yielded = state_dict["batches_yielded"]


class LitRegressor(pl.LightningModule):
    def __init__(self, in_features=8, hidden=32, lr=1e-2, lr_step=4, gamma=0.5):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                 nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y))

    def on_validation_epoch_end(self):
        self.print(f"epoch {self.current_epoch} step {self.global_step}: "
                   f"val_loss {self.trainer.callback_metrics['val_loss']:.4f}")

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=self.hparams.lr_step,
                                                    gamma=self.hparams.gamma)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def synthetic_regression(n, seed, in_features=8):
    generator = torch.Generator().manual_seed(seed)
    w = torch.randn(in_features, generator=torch.Generator().manual_seed(1234)) / in_features ** 0.5
    x = torch.randn(n, in_features, generator=generator)
    y = torch.sin(2 * x @ w) + 0.05 * torch.randn(n, generator=generator)
    return TensorDataset(x, y)


def resume_points(total_steps):
    """Steps after which the job is preempted and restarted from its checkpoint."""
    k = total_steps // 3
    return [k, 2 * k] if k else []


def main():
    parser = argparse.ArgumentParser(description="Lightning fit with ckpt_path after two preemptions")
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps in total, across the resumes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--batches-per-epoch", type=int, default=None, help="default: steps // 3 + 1")
    parser.add_argument("--lr", type=float, default=1e-2)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    # Lightning 2.6 loses an epoch-progress increment when it resumes from a checkpoint written on the last
    # batch of an epoch (the next checkpoint then replays that epoch), so keep both preemptions mid-epoch.
    if args.batches_per_epoch is None:
        args.batches_per_epoch = args.steps // 3 + 1
    train_dataset = synthetic_regression(args.batch_size * args.batches_per_epoch, args.seed)
    val_loader = DataLoader(synthetic_regression(64, args.seed + 1), batch_size=64)

    with tempfile.TemporaryDirectory() as ckpt_dir:
        ckpt_path = None
        for max_steps in resume_points(args.steps) + [args.steps]:
            # A restarted job: fresh model, data, callback and Trainer; max_steps counts from step 0.
            model = LitRegressor(lr=args.lr)
            train_loader = ResumableDataLoader(train_dataset, batch_size=args.batch_size, drop_last=True,
                                               sampler=EpochShuffleSampler(len(train_dataset), args.seed))
            checkpoint_callback = ModelCheckpoint(dirpath=ckpt_dir, filename="{step}",
                                                  every_n_train_steps=max(1, args.steps // 3), save_top_k=-1)
            trainer = pl.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=False,
                                 callbacks=[checkpoint_callback], enable_progress_bar=False,
                                 enable_model_summary=False, num_sanity_val_steps=0)
            trainer.fit(model, train_dataloaders=train_loader, val_dataloaders=val_loader, ckpt_path=ckpt_path)
            ckpt_path = os.path.join(ckpt_dir, f"step={trainer.global_step}.ckpt")
            if trainer.global_step < args.steps:
                print(f"preempted at step {trainer.global_step}; resuming from {os.path.basename(ckpt_path)}")

    print(f"finished at step {trainer.global_step}: train_loss {trainer.callback_metrics['train_loss']:.4f}")


if __name__ == "__main__":
    main()
