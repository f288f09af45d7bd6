"""EMA callback "restores" the training weights from a state_dict that aliases the live parameters.

Bug class: EMA / weight swapping (backup taken by reference, not by copy).

Modelled on: aqlaboratory/openfold#90 "Fix parameter restorage after loading
EMA parameters" -- "``self.cached_weights = self.model.state_dict()`` only
keeps a reference to the parameters, rather than a copy. However,
``self.model.load_state_dict()`` performs an in-place update to the parameters,
which unintentionally changes the parameters in ``self.cached_weights``.
Therefore, the callback at the end of validation step fails to restore the
correct parameters."  (Same family: PKU-YuanGroup/Open-Sora-Plan#186 "Missed to
restore model weights in training after validation with EMA on".)

What goes wrong: before each validation the callback backs up the raw weights
with ``pl_module.state_dict()`` and loads the EMA weights for evaluation.
Because the backup tensors *are* the parameters, loading the EMA weights
overwrites the backup too, and the "restore" after validation is a no-op.
Training silently continues from the EMA average after every validation
(optimizer moments now mismatch the weights; progress is dragged back towards
the slow average).  Validation metrics look good, so nobody notices.

Healthy twin: backs up ``{k: v.detach().clone() ...}`` so the raw weights are
really restored after validation.

Onset: validation runs at the end of every epoch of 10 optimizer steps; the
first optimizer step taken from the wrong (EMA) weights is K = 10.
"""
import sys

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, TensorDataset

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)
L.seed_everything(0, verbose=False)

D, C = 16, 4
N_TRAIN, N_VAL = 320, 96
BATCH = 32               # 10 optimizer steps per epoch
MAX_EPOCHS = 5


def make_data():
    gen = torch.Generator().manual_seed(21)
    w = torch.randn(D, C, generator=gen)
    x = torch.randn(N_TRAIN + N_VAL, D, generator=gen)
    y = (torch.tanh(x) @ w + 0.3 * torch.randn(N_TRAIN + N_VAL, C, generator=gen)).argmax(1)
    train = TensorDataset(x[:N_TRAIN], y[:N_TRAIN])
    val = TensorDataset(x[N_TRAIN:], y[N_TRAIN:])
    return (DataLoader(train, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(4)),
            DataLoader(val, batch_size=N_VAL))


class EMACallback(Callback):
    """Keeps an exponential moving average of the weights and validates with it."""

    def __init__(self, decay=0.9):
        self.decay = decay
        self.ema = None
        self.backup = None
        self.swaps = 0

    def on_fit_start(self, trainer, pl_module):
        self.ema = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}

    @torch.no_grad()
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        for k, v in pl_module.state_dict().items():
            if v.dtype.is_floating_point:
                self.ema[k].mul_(self.decay).add_(v.detach(), alpha=1 - self.decay)
            else:
                self.ema[k].copy_(v)

    def on_validation_start(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        if HEALTHY:
            self.backup = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        else:
            self.backup = pl_module.state_dict()  # BUG: references to the live tensors, not a copy
        pl_module.load_state_dict(self.ema)

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking or self.backup is None:
            return
        pl_module.load_state_dict(self.backup)
        self.backup = None
        self.swaps += 1
        if self.swaps == 1 and not HEALTHY:
            print(f"ONSET step {trainer.global_step}")


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(D, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                                 nn.Linear(64, C))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        if self.global_step % 5 == 0:
            print(f"step {self.global_step:3d} train_loss {loss.item():.4f}")
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        acc = (logits.argmax(1) == y).float().mean()
        print(f"epoch {self.current_epoch} val_loss {F.cross_entropy(logits, y).item():.4f} "
              f"val_acc {acc.item():.3f}")

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=3e-3)


train_loader, val_loader = make_data()
trainer = L.Trainer(
    max_epochs=MAX_EPOCHS,
    accelerator="cpu",
    devices=1,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    num_sanity_val_steps=0,
    callbacks=[EMACallback(decay=0.9)],
)
trainer.fit(Classifier(), train_dataloaders=train_loader, val_dataloaders=val_loader)
print("done")
