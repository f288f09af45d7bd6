"""A small CNN image classifier trained with Lightning's Trainer and a LightningDataModule.

Modelled on: the Lightning docs' "LightningModule" / "LightningDataModule" guides and
the lightning-tutorials "CIFAR10 baseline" notebook
(Lightning-AI/tutorials lightning_examples/cifar10-baseline).  Habits reproduced:
``save_hyperparameters()``, a shared ``_shared_step`` for train/val, ``torchmetrics``
accuracy objects held by the module, ``self.log(..., prog_bar=True)``,
``configure_optimizers`` returning an SGD optimizer with a ``OneCycleLR`` stepped every
batch (``"interval": "step"``), ``gradient_clip_val``, ``val_check_interval`` with
``limit_val_batches``, and a final ``trainer.validate`` after ``fit``.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchmetrics
from lightning.pytorch import LightningDataModule, LightningModule, Trainer, seed_everything
import torch.utils.checkpoint
from torch.utils.data import DataLoader, TensorDataset, random_split

NUM_CLASSES = 4


class BlobsDataModule(LightningDataModule):
    """Random 3x16x16 images with a class-dependent bright quadrant."""

    def __init__(self, batch_size: int = 16, seed: int = 0, train_samples: int = 256):
        super().__init__()
        self.batch_size = batch_size
        self.seed = seed
        self.train_samples = train_samples

    def setup(self, stage=None):
        g = torch.Generator().manual_seed(self.seed)
        total = self.train_samples + 64
        labels = torch.randint(0, NUM_CLASSES, (total,), generator=g)
        images = torch.randn(total, 3, 16, 16, generator=g) * 0.5
        for c in range(NUM_CLASSES):
            r, col = divmod(c, 2)
            images[labels == c, :, r * 8:(r + 1) * 8, col * 8:(col + 1) * 8] += 1.0
        full = TensorDataset(images, labels)
        self.train_set, self.val_set = random_split(full, [self.train_samples, 64], generator=torch.Generator().manual_seed(self.seed))

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, num_workers=0)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=32, num_workers=0)


class LitConvNet(LightningModule):
    def __init__(self, lr: float = 0.05, momentum: float = 0.9, total_steps: int = 100,
                 checkpoint_head: bool = False):
        super().__init__()
        self.save_hyperparameters()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.25), nn.Linear(32 * 4 * 4, NUM_CLASSES))
        self.train_acc = torchmetrics.Accuracy(task="multiclass", num_classes=NUM_CLASSES)
        self.val_acc = torchmetrics.Accuracy(task="multiclass", num_classes=NUM_CLASSES)

    def forward(self, x):
        features = self.features(x)
        if self.hparams.checkpoint_head and self.training and torch.is_grad_enabled():
            # recompute the head (its dropout included) in the backward
            return torch.utils.checkpoint.checkpoint(self.classifier, features, use_reentrant=False)
        return self.classifier(features)

    def _shared_step(self, batch):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        preds = torch.argmax(logits, dim=1)
        return loss, preds, y

    def training_step(self, batch, batch_idx):
        loss, preds, y = self._shared_step(batch)
        self.train_acc(preds, y)
        self.log("train_loss", loss, prog_bar=True)
        self.log("train_acc", self.train_acc, on_step=True, on_epoch=False)
        return loss

    def validation_step(self, batch, batch_idx):
        loss, preds, y = self._shared_step(batch)
        self.val_acc(preds, y)
        self.log("val_loss", loss, prog_bar=True)
        self.log("val_acc", self.val_acc, prog_bar=True)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=self.hparams.momentum,
                                    weight_decay=5e-4)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=self.hparams.lr,
                                                        total_steps=self.hparams.total_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--val-every", type=int, default=4, help="validate every N training batches")
    parser.add_argument("--devices", type=int, default=1, help="CPU processes (2: DDP, launched by Lightning)")
    parser.add_argument("--checkpoint-head", action="store_true", help="activation checkpointing of the head")
    parser.add_argument("--train-samples", type=int, default=256, help="training set size (epochs are shorter)")
    parser.add_argument("--precision", default="32-true", help="Trainer precision (bf16-mixed: autocast)")
    args = parser.parse_args()

    seed_everything(args.seed, workers=True, verbose=False)
    dm = BlobsDataModule(seed=args.seed, train_samples=args.train_samples)
    model = LitConvNet(total_steps=args.steps, checkpoint_head=args.checkpoint_head)
    trainer = Trainer(
        max_steps=args.steps,
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        val_check_interval=args.val_every,
        limit_val_batches=2,
        num_sanity_val_steps=1,
        gradient_clip_val=1.0,
        deterministic=True,
        precision=args.precision,
    )
    trainer.fit(model, datamodule=dm)
    results = trainer.validate(model, datamodule=dm, verbose=False)
    print(f"global_step={trainer.global_step} val={results[0]}")


if __name__ == "__main__":
    main()
