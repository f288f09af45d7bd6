"""Healthy: the Lightning docs' "Manual Optimization" page (automatic_optimization = False): self.optimizers(),
self.manual_backward(loss / N), gradient accumulation that steps every N=2 batches
(`if (batch_idx + 1) % N == 0`), self.clip_gradients(opt, gradient_clip_val=0.5, gradient_clip_algorithm="norm"),
opt.zero_grad() after the step, and a StepLR scheduler stepped by hand at epoch end via self.lr_schedulers()
(on_train_epoch_end), with a validation_step logging accuracy; Trainer on CPU with a small GRU sequence classifier."""
import torch
from torch import nn
import torch.nn.functional as F
import lightning as L
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
def make(n):
    x = torch.randn(n, 12, 8); y = (x[:, :, 0].sum(1) > 0).long()
    return TensorDataset(x, y)
class SeqClassifier(L.LightningModule):
    def __init__(self, accumulate=2):
        super().__init__()
        self.automatic_optimization = False
        self.accumulate = accumulate
        self.gru = nn.GRU(8, 32, batch_first=True); self.drop = nn.Dropout(0.2); self.head = nn.Linear(32, 2)
    def forward(self, x):
        _, h = self.gru(x); return self.head(self.drop(h[-1]))
    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.manual_backward(loss / self.accumulate)
        if (batch_idx + 1) % self.accumulate == 0:
            self.clip_gradients(opt, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
            opt.step()
            opt.zero_grad()
        self.log("train_loss", loss, prog_bar=True)
    def on_train_epoch_end(self):
        sch = self.lr_schedulers(); sch.step()
    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y)); self.log("val_acc", (logits.argmax(1) == y).float().mean())
    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=3e-3)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)]
train = DataLoader(make(640), batch_size=32, shuffle=True); val = DataLoader(make(128), batch_size=64)
trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=3, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
trainer.fit(SeqClassifier(), train, val)
print(trainer.callback_metrics)
