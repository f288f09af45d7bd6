"""P09 (class: EMA weights mixed into training -- EMA swap-in for validation never undone) -- Lightning.

Modelled on aqlaboratory/openfold#90 "Fix parameter restorage after loading EMA parameters":
the Lightning wrapper cached the training weights with `self.cached_weights =
self.model.state_dict()` before loading the EMA weights for validation, but `state_dict()`
returns references to the live tensors, and `load_state_dict()` copies in place, so the
"cached" weights become the EMA weights too and the restore after validation is a no-op:
"the current implementation always replaces the training parameters with EMA parameters
at the end of each epoch.  Empirically, I found this slows down the convergence very much."
(Same family: PKU-YuanGroup/Open-Sora-Plan#186, harubaru/waifu-diffusion#31,
open-mmlab/mmengine#266 "state_dict is a shallow copy of model weights".)

A Lightning EMA callback on a small residual MLP classifier, bf16-mixed on CPU.  Validation
runs at the end of every 12-step epoch, with EMA weights swapped in.  From the first step
after the first validation (optimizer step 12) training silently continues from the
lagging EMA weights (with Adam moments that belong to the raw weights), and again after
every later validation.  Healthy twin: the backup is a detached clone of the state dict.
"""
import sys
import torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.data import TensorDataset, DataLoader
import lightning as L

HEALTHY = "--healthy" in sys.argv


class EMACallback(L.Callback):
    def __init__(self, decay=0.95):
        self.decay = decay
        self.ema_state = None
        self.backup = None

    def on_fit_start(self, trainer, pl_module):
        self.ema_state = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}

    @torch.no_grad()
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        for k, v in pl_module.state_dict().items():
            if v.dtype.is_floating_point:
                self.ema_state[k].mul_(self.decay).add_(v.detach(), alpha=1 - self.decay)
            else:
                self.ema_state[k].copy_(v)

    def on_validation_start(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        if HEALTHY:
            self.backup = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
        else:
            self.backup = pl_module.state_dict()          # BUG: references to the live tensors
        pl_module.load_state_dict(self.ema_state)

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking or self.backup is None:
            return
        pl_module.load_state_dict(self.backup)            # no-op in the buggy variant
        self.backup = None
        if not HEALTHY and trainer.global_step == 12:
            print("ONSET step", trainer.global_step)


class ResBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.GELU(), nn.Dropout(0.1), nn.Linear(2 * d, d))

    def forward(self, x):
        return x + self.net(x)


class LitClassifier(L.LightningModule):
    def __init__(self, d_in=32, d=96, n_cls=8, lr=3e-3, total_steps=36):
        super().__init__()
        self.save_hyperparameters()
        self.stem = nn.Linear(d_in, d)
        self.blocks = nn.Sequential(ResBlock(d), ResBlock(d), ResBlock(d))
        self.head = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, n_cls))

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y, label_smoothing=0.05)
        if self.global_step % 4 == 0:
            print(f"step {self.global_step:2d} train_loss {loss.item():.4f}")
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y), prog_bar=False)
        self.log("val_acc", (logits.argmax(-1) == y).float().mean(), prog_bar=False)

    def on_validation_epoch_end(self):
        m = self.trainer.callback_metrics
        if not self.trainer.sanity_checking:
            print(f"  [val/ema] after step {self.global_step}: loss {m['val_loss']:.4f} acc {m['val_acc']:.3f}")

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.05)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=self.hparams.lr, total_steps=self.hparams.total_steps,
                                                    pct_start=0.15)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def make_data(n, g, W1, W2):
    x = torch.randn(n, 32, generator=g)
    y = (torch.tanh(x @ W1) @ W2 + 0.3 * torch.randn(n, 8, generator=g)).argmax(1)
    return TensorDataset(x, y)


def main():
    L.seed_everything(0, verbose=False)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(5)
    W1, W2 = torch.randn(32, 64, generator=g), torch.randn(64, 8, generator=g)
    train_ds, val_ds = make_data(12 * 64, g, W1, W2), make_data(512, g, W1, W2)
    train_dl = DataLoader(train_ds, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0))
    val_dl = DataLoader(val_ds, batch_size=256)
    model = LitClassifier()
    trainer = L.Trainer(max_epochs=3, accelerator="cpu", devices=1, precision="bf16-mixed",
                        callbacks=[EMACallback(decay=0.95)], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        check_val_every_n_epoch=1, gradient_clip_val=1.0, deterministic=True)
    trainer.fit(model, train_dl, val_dl)
    print("done, global_step =", trainer.global_step)


if __name__ == "__main__":
    main()
