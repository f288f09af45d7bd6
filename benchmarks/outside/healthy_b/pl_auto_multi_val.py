"""Modelled on the Lightning docs: configure_optimizers returning {"optimizer", "lr_scheduler":
{"scheduler": OneCycleLR, "interval": "step"}}, validation with multiple dataloaders
(validation_step(..., dataloader_idx)), val_check_interval, ModelCheckpoint + LearningRateMonitor;
plus an EMA callback that swaps EMA weights in for validation, after NeMo's
nemo/collections/common/callbacks/ema.py (EMA.swap_model_weights on validation start/end)."""
import torch, torch.nn as nn, torch.nn.functional as F
import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, LearningRateMonitor
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import TensorDataset, DataLoader
L.seed_everything(0)

def blobs(n, shift=0.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    centers = torch.tensor([[2., 0], [0, 2], [-2, 0], [0, -2]])
    x = torch.cat([centers[y] + 0.6 * torch.randn(n, 2, generator=g), torch.randn(n, 14, generator=g)], 1) + shift
    return TensorDataset(x, y)

class LitMLP(L.LightningModule):
    def __init__(self, lr=3e-3, total_steps=48):
        super().__init__(); self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.LayerNorm(64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 4))
    def forward(self, x): return self.net(x)
    def training_step(self, batch, batch_idx):
        x, y = batch; loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True); return loss
    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        x, y = batch; logits = self(x)
        name = ["in_dist", "shifted"][dataloader_idx]
        self.log(f"val_loss/{name}", F.cross_entropy(logits, y), add_dataloader_idx=False)
        self.log(f"val_acc/{name}", (logits.argmax(-1) == y).float().mean(), add_dataloader_idx=False)
    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.05)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=self.hparams.lr, total_steps=self.hparams.total_steps)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 1}}

class EMA(Callback):
    def __init__(self, decay=0.9): self.decay, self.ema, self.backup = decay, None, None
    def on_fit_start(self, trainer, pl_module):
        self.ema = [p.detach().clone() for p in pl_module.parameters()]
    @torch.no_grad()
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        torch._foreach_lerp_(self.ema, [p.detach() for p in pl_module.parameters()], 1 - self.decay)
    @torch.no_grad()
    def swap(self, pl_module):
        for p, e in zip(pl_module.parameters(), self.ema):
            tmp = p.detach().clone(); p.copy_(e); e.copy_(tmp)
    def on_validation_start(self, trainer, pl_module):
        if not trainer.sanity_checking: self.swap(pl_module)
    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking: self.swap(pl_module)

train = DataLoader(blobs(384), batch_size=16, shuffle=True)
vals = [DataLoader(blobs(96, seed=1), batch_size=48), DataLoader(blobs(96, shift=0.5, seed=2), batch_size=48)]
trainer = L.Trainer(max_epochs=2, accelerator="cpu", devices=1, val_check_interval=12, enable_progress_bar=False,
                    logger=CSVLogger("out/pl_auto"), log_every_n_steps=4,
                    callbacks=[EMA(0.9), ModelCheckpoint(monitor="val_loss/in_dist", save_top_k=1),
                               LearningRateMonitor(logging_interval="step")])
trainer.fit(LitMLP(), train, vals)
print(trainer.validate(ckpt_path="best", dataloaders=vals, verbose=False))
