"""1-D CNN time-series classifier in Lightning with ReduceLROnPlateau driven by a logged
validation metric, early stopping, top-k checkpointing, an LR monitor, gradient
accumulation and clipping, validation twice per epoch, and testing from the best
checkpoint.

Modelled on the Lightning documentation recipes ("configure_optimizers" returning an
lr_scheduler config with "monitor": "val_loss" for ReduceLROnPlateau; EarlyStopping;
ModelCheckpoint(save_top_k, monitor); LearningRateMonitor; Trainer(accumulate_grad_batches,
gradient_clip_val, val_check_interval); trainer.test(ckpt_path="best")) applied to a
human-activity-recognition style 1-D CNN such as in the Lightning-AI tutorials' time-series
examples.

Unusual loop: the LR only changes when the validation metric stalls, each optimizer step
consumes two batches, validation runs mid-epoch, training may end before max_epochs, and the
final test reloads weights from a checkpoint file rather than using the live model.
"""
import os
import tempfile
import warnings

import lightning.pytorch as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
warnings.filterwarnings("ignore")


def make_signals(n, seed):
    """5 'activities': sinusoids of different frequency/axis mix plus noise, 3 channels x 64."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 5, (n,), generator=g)
    t = torch.linspace(0, 1, 64)
    freq = torch.tensor([2.0, 3.0, 5.0, 3.0, 7.0])[y]
    axis_gain = torch.tensor([[1, .2, .2], [.2, 1, .2], [1, 1, .2], [.2, .2, 1], [.5, .5, .5]])[y]
    phase = torch.rand(n, 1, generator=g) * 6.28
    base = torch.sin(2 * 3.14159 * freq[:, None] * t[None] + phase)
    x = axis_gain[:, :, None] * base[:, None, :] + 1.3 * torch.randn(n, 3, 64, generator=g)
    return TensorDataset(x, y)


class HARNet(pl.LightningModule):
    def __init__(self, lr=3e-3):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv1d(3, 32, 5, padding=2), nn.BatchNorm1d(32), nn.ReLU(), nn.MaxPool1d(2),
            nn.Conv1d(32, 64, 5, padding=2), nn.BatchNorm1d(64), nn.ReLU(), nn.MaxPool1d(2),
            nn.Conv1d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(),
            nn.Dropout(0.3), nn.Linear(64, 5))

    def forward(self, x):
        return self.net(x)

    def _shared(self, batch, stage):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        acc = (logits.argmax(1) == y).float().mean()
        self.log(f"{stage}_loss", loss, prog_bar=False, on_epoch=True, on_step=(stage == "train"))
        self.log(f"{stage}_acc", acc, on_epoch=True, on_step=False)
        return loss

    def training_step(self, batch, batch_idx):
        return self._shared(batch, "train")

    def validation_step(self, batch, batch_idx):
        self._shared(batch, "val")

    def test_step(self, batch, batch_idx):
        self._shared(batch, "test")

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr, weight_decay=1e-4)
        sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", factor=0.3, patience=0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "monitor": "val_loss", "interval": "epoch"}}


pl.seed_everything(0, verbose=False)
train_dl = DataLoader(make_signals(1280, 1), batch_size=32, shuffle=True)
val_dl = DataLoader(make_signals(320, 2), batch_size=128)
test_dl = DataLoader(make_signals(320, 3), batch_size=128)

with tempfile.TemporaryDirectory() as root:
    ckpt = ModelCheckpoint(dirpath=os.path.join(root, "ckpt"), monitor="val_loss", mode="min", save_top_k=2,
                           filename="har-{epoch}-{step}-{val_loss:.3f}")
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=10, accumulate_grad_batches=2, gradient_clip_val=1.0,
        val_check_interval=0.5, logger=CSVLogger(root, name="har"), enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ckpt, EarlyStopping(monitor="val_loss", patience=4, mode="min"),
                   LearningRateMonitor(logging_interval="epoch")])
    model = HARNet()
    trainer.fit(model, train_dl, val_dl)
    m = trainer.logged_metrics
    print(f"stopped after epoch {trainer.current_epoch}, optimizer steps {trainer.global_step}, "
          f"last lr {trainer.optimizers[0].param_groups[0]['lr']:.1e}")
    import csv
    rows = list(csv.DictReader(open(os.path.join(trainer.logger.log_dir, "metrics.csv"))))
    vals = [(r["step"], round(float(r["val_loss"]), 3)) for r in rows if r.get("val_loss")]
    trains = [round(float(r["train_loss_epoch"]), 3) for r in rows if r.get("train_loss_epoch")]
    print("train loss per epoch:", trains)
    print("val loss (step, value):", vals)
    print("best:", os.path.basename(ckpt.best_model_path))
    res = trainer.test(model, test_dl, ckpt_path="best", verbose=False)[0]
    print(f"test from best checkpoint: loss {res['test_loss']:.4f} acc {res['test_acc']:.3f}")
