"""Augmentation curriculum never reaches the persistent DataLoader workers (Lightning).

Bug class: data pipeline state updated in the main process but not in the
worker processes (epoch-dependent dataset attribute frozen in persistent
workers), so the data distribution silently stops following the schedule.

Modelled on: pytorch/pytorch#97326 "Change worker process's attribute while set
persistent_worker = True" (a dataset ``epoch`` attribute updated during
training stays at its initial value in persistent workers) and
starVLA/starVLA#470 / PR #471 "synchronize epochs across persistent workers"
(workers kept their initial epoch, so sampling never changed across epochs).
The program is a LightningDataModule + LightningModule image classifier whose
dataset ramps its augmentation magnitude (noise, shifts, cut-out) per epoch
from ``on_train_epoch_start``, with ``num_workers=2``.

What goes wrong: with ``persistent_workers=True`` the worker processes hold
their own copy of the dataset made when they were started (epoch 0).  From
epoch 1 on the main-process copy gets magnitude 1, 2, ... but every batch is
still produced with magnitude 0, so the model trains on the easy, weakly
augmented distribution for the whole run.  No warning, loss looks fine (lower
than it should be).

Healthy twin: ``persistent_workers=False`` (workers are re-created each epoch
from the updated dataset), everything else equal.

Onset: 96 examples / batch 8 = 12 optimizer steps per epoch; the first batch
that should carry the magnitude-1 augmentation is used by optimizer step
K = 12 (5 epochs = 60 steps, 48 affected).
"""
import sys
import tempfile

import lightning.pytorch as pl
import torch
import torch.nn as nn
import torch.nn.functional as F

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)
pl.seed_everything(0, verbose=False)

N_EX, BATCH, N_CLASSES, SIZE = 96, 8, 4, 16


def make_images(n, gen):
    labels = torch.randint(0, N_CLASSES, (n,), generator=gen)
    x = 0.3 * torch.randn(n, 1, SIZE, SIZE, generator=gen)
    for i, c in enumerate(labels.tolist()):
        r, s = divmod(c, 2)
        x[i, 0, 2 + 6 * r:8 + 6 * r, 2 + 6 * s:8 + 6 * s] += 1.0  # bright quadrant-ish block
    return x, labels


class AugCurriculumDataset(torch.utils.data.Dataset):
    def __init__(self, images, labels):
        self.images, self.labels = images, labels
        self.magnitude = 0

    def set_magnitude(self, m):
        self.magnitude = m

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        x = self.images[i].clone()
        m = self.magnitude
        if m > 0:
            dx, dy = torch.randint(-m, m + 1, (2,)).tolist()
            x = torch.roll(x, shifts=(dy, dx), dims=(1, 2))
            x = x + 0.15 * m * torch.randn_like(x)
            cut = 2 * m
            r, c = torch.randint(0, SIZE - cut + 1, (2,)).tolist()
            x[:, r:r + cut, c:c + cut] = 0.0
        return x, self.labels[i]


class ImageDataModule(pl.LightningDataModule):
    def __init__(self):
        super().__init__()
        images, labels = make_images(N_EX, torch.Generator().manual_seed(5))
        self.train_set = AugCurriculumDataset(images, labels)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(
            self.train_set, batch_size=BATCH, shuffle=True, num_workers=2,
            persistent_workers=not HEALTHY, generator=torch.Generator().manual_seed(2))


class SmallCNN(pl.LightningModule):
    def __init__(self, lr=2e-3):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Dropout(0.2), nn.Linear(32 * 4 * 4, N_CLASSES))

    def on_train_epoch_start(self):
        self.trainer.datamodule.train_set.set_magnitude(self.current_epoch)
        if not HEALTHY and self.current_epoch == 1:
            print(f"ONSET step {self.trainer.global_step}")

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


if __name__ == "__main__":
    dm = ImageDataModule()
    model = SmallCNN()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = pl.Trainer(max_epochs=5, accelerator="cpu", devices=1, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, default_root_dir=tmp)
        trainer.fit(model, datamodule=dm)
    print(f"steps {trainer.global_step}")
    print("done")
