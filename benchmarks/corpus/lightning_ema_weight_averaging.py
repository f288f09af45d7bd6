"""A Lightning text classifier trained with an exponential moving average of its weights.

Modelled on: the Lightning docs for weight averaging
(https://lightning.ai/docs/pytorch/stable/advanced/training_tricks.html#weight-averaging,
lightning/pytorch/callbacks/weight_averaging.py) and the torchtext-style EmbeddingBag
classifier of the PyTorch "Text classification with the torchtext library" tutorial.
Habits reproduced: an ``nn.EmbeddingBag`` over offsets-packed token bags and a linear head,
a ``LightningDataModule`` with a collate function that builds the offsets, the built-in
``EMAWeightAveraging`` callback (an ``AveragedModel`` deep copy updated after each optimizer
step, swapped into the module for validation and copied into it when fitting ends),
``accumulate_grad_batches=2``, SGD with a ``StepLR`` stepped per epoch, validation every few
batches and a final ``trainer.validate`` of the averaged weights.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.pytorch import LightningDataModule, LightningModule, Trainer, seed_everything
from lightning.pytorch.callbacks import EMAWeightAveraging
from torch.utils.data import DataLoader, Dataset

VOCAB, CLASSES = 200, 4


class TokenBags(Dataset):
    """Variable-length token bags whose class decides which part of the vocabulary they draw from."""

    def __init__(self, size: int, seed: int):
        generator = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, CLASSES, (size,), generator=generator)
        self.bags = []
        for label in self.labels.tolist():
            length = int(torch.randint(4, 12, (1,), generator=generator))
            topical = torch.randint(label * 40, label * 40 + 40, (length // 2,), generator=generator)
            noise = torch.randint(0, VOCAB, (length - length // 2,), generator=generator)
            self.bags.append(torch.cat([topical, noise]))

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return self.labels[index], self.bags[index]


def collate_batch(batch):
    labels = torch.stack([label for label, _ in batch])
    offsets = torch.tensor([0] + [len(bag) for _, bag in batch[:-1]]).cumsum(dim=0)
    return labels, torch.cat([bag for _, bag in batch]), offsets


class BagsDataModule(LightningDataModule):
    def __init__(self, seed: int, batch_size: int = 16):
        super().__init__()
        self.seed, self.batch_size = seed, batch_size

    def setup(self, stage=None):
        self.train_set = TokenBags(640, self.seed)
        self.val_set = TokenBags(64, self.seed + 1)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, collate_fn=collate_batch)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size, collate_fn=collate_batch)


class TextClassifier(LightningModule):
    def __init__(self, embed_dim: int = 32, lr: float = 2.0):
        super().__init__()
        self.save_hyperparameters()
        self.embedding = nn.EmbeddingBag(VOCAB, embed_dim)
        self.fc = nn.Linear(embed_dim, CLASSES)
        initrange = 0.5
        self.embedding.weight.data.uniform_(-initrange, initrange)
        self.fc.weight.data.uniform_(-initrange, initrange)
        self.fc.bias.data.zero_()

    def forward(self, text, offsets):
        return self.fc(self.embedding(text, offsets))

    def training_step(self, batch, batch_idx):
        labels, text, offsets = batch
        loss = F.cross_entropy(self(text, offsets), labels)
        self.log("train_loss", loss, batch_size=len(labels))
        return loss

    def validation_step(self, batch, batch_idx):
        labels, text, offsets = batch
        logits = self(text, offsets)
        self.log("val_loss", F.cross_entropy(logits, labels), batch_size=len(labels))
        self.log("val_acc", (logits.argmax(1) == labels).float().mean(), batch_size=len(labels))

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)
        return [optimizer], [scheduler]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps in total")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--val-every", type=int, default=6, help="validate every N training batches")
    args = parser.parse_args()

    torch.set_num_threads(1)
    seed_everything(args.seed, verbose=False)
    trainer = Trainer(
        max_steps=args.steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accumulate_grad_batches=2,
        gradient_clip_val=0.1,
        val_check_interval=args.val_every,
        limit_val_batches=2,
        num_sanity_val_steps=0,
        callbacks=[EMAWeightAveraging(decay=0.9)],
    )
    model = TextClassifier()
    datamodule = BagsDataModule(seed=args.seed)
    trainer.fit(model, datamodule=datamodule)
    results = trainer.validate(model, datamodule=datamodule, verbose=False)
    print(f"global_step={trainer.global_step} averaged weights: val_acc={results[0]['val_acc']:.3f}")


if __name__ == "__main__":
    main()
