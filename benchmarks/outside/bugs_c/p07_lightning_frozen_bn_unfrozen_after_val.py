"""P07 (class: frozen BatchNorm put back into train mode -- a frozen, "pretrained" backbone's BN layers start
normalising with batch statistics and overwriting their running statistics after the first validation) --
PyTorch Lightning.

Modelled on Lightning-AI/pytorch-lightning#2551 "TrainerEvaluationLoopMixin activates model.train() at the end"
and #18930 ("Identify parts of the models that are set in '.eval()' mode ... and keep them in eval mode after
validation epoch ends": a frozen submodule's BatchNorm running stats change because the whole model is set to
.train() after validation).  PR #18951 made the loop restore per-submodule modes, *unless* the user overrides
`on_validation_model_train` -- then the hook is called instead, and its default body (what `super()` runs) is
`self.trainer.model.train()` (see #20177 "Trainer does not switch to train mode after validation step").

Here a transfer-learning LightningModule freezes a BN backbone (requires_grad=False + .eval()) and trains an MLP
head; it overrides on_validation_model_eval/on_validation_model_train to use MC-dropout in validation and
calls super() in both.  Validation runs every 12 steps (val_check_interval=12, no sanity check), so from
optimizer step 12 on the frozen backbone's BatchNorm layers are in train mode.  Healthy twin: the override
re-applies `self.backbone.eval()` after super().
"""
import argparse
import logging
import warnings
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint, LearningRateMonitor
from lightning.pytorch.loggers import CSVLogger

parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true")
parser.add_argument("--max-steps", type=int, default=36)
parser.add_argument("--batch-size", type=int, default=32)
args = parser.parse_args()
HEALTHY = args.healthy
warnings.filterwarnings("ignore")
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
L.seed_everything(0, verbose=False)

NUM_CLASSES = 5
g0 = torch.Generator().manual_seed(42)
templates = F.interpolate(torch.randn(NUM_CLASSES, 3, 4, 4, generator=g0), size=16, mode="bilinear",
                          align_corners=False)


def make_split(n, g, shift=0.0, scale=1.0):
    y = torch.randint(0, NUM_CLASSES, (n,), generator=g)
    x = 1.2 * templates[y] + torch.randn(n, 3, 16, 16, generator=g)
    return scale * x + shift, y


def build_backbone():
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten())


@torch.no_grad()
def load_pretrained_statistics(backbone):
    """Stand-in for loading an ImageNet checkpoint: calibrate BN running stats on 'source-domain' data."""
    g = torch.Generator().manual_seed(7)
    for m in backbone.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None  # cumulative average
    backbone.train()
    for _ in range(8):
        x, _ = make_split(64, g)
        backbone(x)
    for m in backbone.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.momentum = 0.1


class TransferLearningModel(L.LightningModule):
    def __init__(self, lr=1e-2, mc_samples=4):
        super().__init__()
        self.save_hyperparameters()
        self.backbone = build_backbone()
        load_pretrained_statistics(self.backbone)
        self.backbone.requires_grad_(False)
        self.backbone.eval()  # frozen feature extractor: keep BN running stats fixed
        self.head = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, NUM_CLASSES))
        self._onset_reported = False

    def forward(self, x):
        return self.head(self.backbone(x))

    def on_train_batch_start(self, batch, batch_idx):
        if not HEALTHY and not self._onset_reported and self.backbone[1].training:
            print(f"ONSET step {self.global_step}")
            self._onset_reported = True

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        acc = (logits.argmax(1) == y).float().mean()
        self.log("train_loss", loss, prog_bar=False)
        self.log("train_acc", acc)
        if self.global_step % 4 == 0:
            print(f"step {self.global_step} train_loss {loss.item():.4f} train_acc {acc.item():.3f}")
        return loss

    # --- MC-dropout validation: dropout stays active in the head during validation ---
    def on_validation_model_eval(self):
        super().on_validation_model_eval()
        for m in self.head.modules():
            if isinstance(m, nn.Dropout):
                m.train()

    def on_validation_model_train(self):
        super().on_validation_model_train()  # default body: self.trainer.model.train()
        if HEALTHY:
            self.backbone.eval()  # the fix: re-freeze the backbone's BatchNorm layers

    def validation_step(self, batch, batch_idx):
        x, y = batch
        probs = torch.stack([F.softmax(self(x).float(), -1) for _ in range(self.hparams.mc_samples)]).mean(0)
        loss = F.nll_loss(probs.clamp_min(1e-8).log(), y)
        acc = (probs.argmax(1) == y).float().mean()
        entropy = -(probs * probs.clamp_min(1e-8).log()).sum(-1).mean()
        self.log_dict({"val_loss": loss, "val_acc": acc, "val_entropy": entropy})
        return loss

    def on_validation_epoch_end(self):
        m = self.trainer.callback_metrics
        print(f"validation @ step {self.global_step}: val_loss {m['val_loss']:.4f} val_acc {m['val_acc']:.3f} "
              f"entropy {m['val_entropy']:.3f}")

    def configure_optimizers(self):
        params = [p for p in self.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=self.hparams.lr, weight_decay=1e-2)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.max_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class TargetDomain(L.LightningDataModule):
    def setup(self, stage=None):
        g = torch.Generator().manual_seed(123)
        # target domain differs from the pretraining domain (intensity shift / contrast)
        self.train_set = TensorDataset(*make_split(args.max_steps * args.batch_size, g, shift=0.7, scale=1.6))
        self.val_set = TensorDataset(*make_split(128, g, shift=0.7, scale=1.6))

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=args.batch_size, shuffle=True,
                          generator=torch.Generator().manual_seed(0))

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=64)


model = TransferLearningModel()
trainer = L.Trainer(
    accelerator="cpu", devices=1, precision="bf16-mixed", max_steps=args.max_steps, val_check_interval=12,
    num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False,
    logger=CSVLogger(save_dir=".", name="p07_logs"),
    callbacks=[ModelCheckpoint(dirpath="p07_checkpoints", monitor="val_acc", mode="max", save_top_k=1),
               LearningRateMonitor(logging_interval="step")],
)
trainer.fit(model, datamodule=TargetDomain())
print(f"done: global_step {trainer.global_step}; best checkpoint {trainer.checkpoint_callback.best_model_path}")
