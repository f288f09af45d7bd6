"""Modelled on the Lightning docs 'Stochastic Weight Averaging' (Trainer(callbacks=
[StochasticWeightAveraging(swa_lrs=1e-2)])) with precision="bf16-mixed", gradient_clip_val and
a CosineAnnealingLR scheduler, as in Lightning's SWA example in the 'Effective Training
Techniques' docs. 1-D CNN regressor with BatchNorm (SWA recomputes BN statistics at the end)."""
import torch, torch.nn as nn, torch.nn.functional as F
import lightning as L
from lightning.pytorch.callbacks import StochasticWeightAveraging
from torch.utils.data import TensorDataset, DataLoader
L.seed_everything(0)
def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    t = torch.linspace(0, 6.28, 32); f = torch.rand(n, 1, generator=g) * 3 + 1
    x = torch.sin(f * t).unsqueeze(1) + 0.1 * torch.randn(n, 1, 32, generator=g)
    return TensorDataset(x, f)
class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv1d(1, 16, 5, padding=2), nn.BatchNorm1d(16), nn.ReLU(),
                                  nn.Conv1d(16, 16, 5, padding=2), nn.BatchNorm1d(16), nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten())
        self.head = nn.Linear(16, 1)
    def forward(self, x): return self.head(self.body(x))
    def training_step(self, b, i):
        x, y = b; loss = F.mse_loss(self(x).float(), y); self.log("train_mse", loss); return loss
    def validation_step(self, b, i):
        x, y = b; self.log("val_mse", F.mse_loss(self(x).float(), y))
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
        return [opt], [torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4)]
trainer = L.Trainer(max_epochs=4, accelerator="cpu", devices=1, precision="bf16-mixed", gradient_clip_val=1.0,
                    callbacks=[StochasticWeightAveraging(swa_lrs=1e-2, swa_epoch_start=2, annealing_epochs=1)],
                    enable_progress_bar=False, logger=False, enable_checkpointing=False, log_every_n_steps=4)
trainer.fit(Net(), DataLoader(data(192, 0), batch_size=16, shuffle=True), DataLoader(data(64, 1), batch_size=64))
print(trainer.validate(trainer.lightning_module, dataloaders=DataLoader(data(64, 1), batch_size=64), verbose=False))
