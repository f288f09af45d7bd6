"""ResNet-style image classifier in Lightning with OneCycleLR and EMA weights for evaluation.

Modelled on the Lightning tutorial "PyTorch Lightning CIFAR10 ~94% Baseline
Tutorial" (lightning.ai docs, ``LitResnet``): a ResNet adapted to small images,
SGD with momentum and weight decay, ``OneCycleLR`` whose ``total_steps`` comes
from ``trainer.estimated_stepping_batches`` and which is stepped every batch
(``"interval": "step"``), a shared ``evaluate`` method for validation/test with
accuracy, and ``LearningRateMonitor``-style LR inspection.

Added on top, in the way timm's ``ModelEmaV2`` / many Lightning users do it by
hand: an exponential moving average of the parameters (BatchNorm buffers copied)
updated in ``on_train_batch_end``; for validation and test the live weights are
stored, the EMA weights are swapped in, and the live weights are restored
afterwards (``on_validation_epoch_start``/``_end``), so training continues from
the un-averaged weights.  Synthetic 16x16 images, 4 classes; 4 epochs x 16 batches
= 64 optimizer steps.
"""
import argparse

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true", help="ignored")
args = parser.parse_args()

torch.set_num_threads(1)
L.seed_everything(7, workers=True)


def make_dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    x = torch.randn(n, 3, 16, 16, generator=g) * 0.6
    for k in range(4):
        idx = y == k
        x[idx, k % 3, :, :] += 0.4  # colour cue
        if k < 2:
            x[idx, :, 6:10, :] += 0.8  # horizontal band
        else:
            x[idx, :, :, 6:10] += 0.8  # vertical band
    return TensorDataset(x, y)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def create_model(num_classes=4):
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        BasicBlock(16, 16), BasicBlock(16, 32, stride=2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes),
    )


class LitResnet(L.LightningModule):
    def __init__(self, lr=0.05, ema_decay=0.9):
        super().__init__()
        self.save_hyperparameters()
        self.model = create_model()
        self.ema_state = None   # EMA of parameters + copies of buffers
        self._backup = None     # live weights while EMA weights are swapped in

    def forward(self, x):
        return F.log_softmax(self.model(x), dim=1)

    # ---------------------------------------------------------------- EMA
    def on_fit_start(self):
        self.ema_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    @torch.no_grad()
    def on_train_batch_end(self, outputs, batch, batch_idx):
        d = self.hparams.ema_decay
        for k, v in self.model.state_dict().items():
            if v.dtype.is_floating_point:
                self.ema_state[k].mul_(d).add_(v.detach(), alpha=1 - d)
            else:
                self.ema_state[k].copy_(v)

    def _swap_in_ema(self):
        if self.ema_state is None:
            return
        self._backup = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self.model.load_state_dict(self.ema_state)

    def _restore_live(self):
        if self._backup is not None:
            self.model.load_state_dict(self._backup)
            self._backup = None

    def on_validation_epoch_start(self):
        self._swap_in_ema()

    def on_validation_epoch_end(self):
        self._restore_live()

    def on_test_epoch_start(self):
        self._swap_in_ema()

    def on_test_epoch_end(self):
        self._restore_live()

    # ---------------------------------------------------------------- steps
    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.nll_loss(self(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        return loss

    def evaluate(self, batch, stage=None):
        x, y = batch
        logits = self(x)
        loss = F.nll_loss(logits, y)
        acc = (logits.argmax(dim=1) == y).float().mean()
        if stage:
            self.log(f"{stage}_loss", loss, prog_bar=True)
            self.log(f"{stage}_acc", acc, prog_bar=True)

    def validation_step(self, batch, batch_idx):
        self.evaluate(batch, "val")

    def test_step(self, batch, batch_idx):
        self.evaluate(batch, "test")

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9, weight_decay=5e-4)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=0.1, total_steps=self.trainer.estimated_stepping_batches, pct_start=0.25)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class PrintMetrics(L.Callback):
    def on_train_epoch_end(self, trainer, pl_module):
        # runs after the epoch's validation loop, so both train and val metrics are in
        m = trainer.callback_metrics
        lr = trainer.optimizers[0].param_groups[0]["lr"]
        print(f"epoch {trainer.current_epoch} step {trainer.global_step} lr {lr:.4f} "
              f"train_loss {m.get('train_loss_epoch', float('nan')):.4f} "
              f"val_loss(EMA) {m['val_loss']:.4f} val_acc(EMA) {m['val_acc']:.3f}")


train_loader = DataLoader(make_dataset(512, 1), batch_size=32, shuffle=True)
val_loader = DataLoader(make_dataset(256, 2), batch_size=128)
test_loader = DataLoader(make_dataset(256, 3), batch_size=128)

model = LitResnet()
trainer = L.Trainer(
    max_epochs=4,
    accelerator="cpu",
    devices=1,
    logger=False,
    enable_progress_bar=False,
    enable_checkpointing=False,
    enable_model_summary=False,
    num_sanity_val_steps=0,
    callbacks=[PrintMetrics()],
)
trainer.fit(model, train_loader, val_loader)
trainer.test(model, test_loader, verbose=False)
print(f"test (EMA weights): loss {trainer.callback_metrics['test_loss']:.4f} acc {trainer.callback_metrics['test_acc']:.3f}")
