"""Healthy probe: Lightning Trainer with EarlyStopping, accumulate_grad_batches, gradient_clip_val, per-step StepLR and a mid-epoch validation."""
import torch, lightning as L
from torch import nn
torch.manual_seed(0)
class M(L.LightningModule):
    def __init__(self):
        super().__init__(); self.net = nn.Sequential(nn.Linear(10, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 2))
    def training_step(self, b, i):
        x, y = b; loss = nn.functional.cross_entropy(self.net(x), y); self.log("loss", loss); return loss
    def validation_step(self, b, i):
        x, y = b; self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))
    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 3), "interval": "step"}}
g = torch.Generator().manual_seed(0)
X = torch.randn(256, 10, generator=g); Y = (X[:, 0] > 0).long()
ds = torch.utils.data.TensorDataset(X, Y)
tl = torch.utils.data.DataLoader(ds, batch_size=16, shuffle=True)
vl = torch.utils.data.DataLoader(ds, batch_size=32)
t = L.Trainer(max_steps=12, accumulate_grad_batches=2, gradient_clip_val=0.5, val_check_interval=8, callbacks=[L.pytorch.callbacks.EarlyStopping("val_loss", patience=3)],
    logger=False, enable_checkpointing=False, enable_progress_bar=False, accelerator="cpu", devices=1)
t.fit(M(), tl, vl)
