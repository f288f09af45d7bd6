"""Modelled on the Lightning tutorial "PyTorch Lightning CIFAR10 ~94% Baseline Tutorial"
(lightning-tutorials cifar10-baseline: LitResnet, SGD + OneCycleLR with "interval": "step",
validation/test via a shared evaluate()) combined with the Lightning docs "Weight Averaging"
training trick (EMAWeightAveraging callback).

A small residual CNN on synthetic 3x16x16 images (4 classes: oriented stripe patterns with
random colour jitter).  Exercises precision="bf16-mixed" on CPU, accumulate_grad_batches=2,
gradient_clip_val, OneCycleLR sized from trainer.estimated_stepping_batches, an EMA of the
weights (incl. BatchNorm buffers) swapped in for validation/test, ModelCheckpoint on
val_acc, LearningRateMonitor-free logging, and trainer.test() at the end."""
import math
import torch
import torch.nn as nn
import torch.nn.functional as F
import lightning as L
from lightning.pytorch.callbacks import EMAWeightAveraging, ModelCheckpoint
from torch.optim.lr_scheduler import OneCycleLR

L.seed_everything(7)

class StripeDataset(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.y = torch.randint(0, 4, (n,), generator=g)
        yy, xx = torch.meshgrid(torch.arange(16.), torch.arange(16.), indexing="ij")
        angles = torch.tensor([0., 45., 90., 135.]) * math.pi / 180
        x = torch.empty(n, 3, 16, 16)
        for i in range(n):
            a = angles[self.y[i]] + 0.15 * torch.randn(1, generator=g)
            phase = 2 * math.pi * torch.rand(1, generator=g)
            pattern = torch.sin(0.9 * (xx * torch.cos(a) + yy * torch.sin(a)) + phase)
            x[i] = pattern * (0.5 + torch.rand(3, 1, 1, generator=g))
        self.x = x + 0.4 * torch.randn(x.shape, generator=g)
    def __len__(self): return len(self.y)
    def __getitem__(self, i): return self.x[i], self.y[i]

BATCH_SIZE = 32
train_loader = torch.utils.data.DataLoader(StripeDataset(512, 0), batch_size=BATCH_SIZE, shuffle=True)
val_loader = torch.utils.data.DataLoader(StripeDataset(128, 1), batch_size=128)
test_loader = torch.utils.data.DataLoader(StripeDataset(256, 2), batch_size=128)

class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))

def create_model(num_classes=4):
    return nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                         BasicBlock(16, 16), BasicBlock(16, 32, stride=2), BasicBlock(32, 64, stride=2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, num_classes))

class LitResnet(L.LightningModule):
    def __init__(self, lr=0.05):
        super().__init__()
        self.save_hyperparameters()
        self.model = create_model()

    def forward(self, x):
        out = self.model(x)
        return F.log_softmax(out, dim=1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.nll_loss(logits, y)
        self.log("train_loss", loss)
        return loss

    def evaluate(self, batch, stage=None):
        x, y = batch
        logits = self(x)
        loss = F.nll_loss(logits, y)
        preds = torch.argmax(logits, dim=1)
        acc = (preds == y).float().mean()
        if stage:
            self.log(f"{stage}_loss", loss, prog_bar=True)
            self.log(f"{stage}_acc", acc, prog_bar=True)

    def validation_step(self, batch, batch_idx):
        self.evaluate(batch, "val")

    def test_step(self, batch, batch_idx):
        self.evaluate(batch, "test")

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9, weight_decay=5e-4)
        scheduler_dict = {
            "scheduler": OneCycleLR(optimizer, 0.1, total_steps=self.trainer.estimated_stepping_batches),
            "interval": "step",
        }
        return {"optimizer": optimizer, "lr_scheduler": scheduler_dict}

class PrintMetrics(L.Callback):
    def on_validation_epoch_end(self, trainer, pl_module):
        if trainer.sanity_checking:
            return
        m = {k: round(float(v), 4) for k, v in trainer.callback_metrics.items()}
        print(f"epoch {trainer.current_epoch} global_step {trainer.global_step} "
              f"lr {trainer.optimizers[0].param_groups[0]['lr']:.4f} {m}")

model = LitResnet(lr=0.05)
trainer = L.Trainer(
    accelerator="cpu", devices=1, max_epochs=4, precision="bf16-mixed", accumulate_grad_batches=2,
    gradient_clip_val=1.0, logger=False, enable_progress_bar=False, enable_model_summary=False,
    enable_checkpointing=True, num_sanity_val_steps=0,
    callbacks=[EMAWeightAveraging(decay=0.9), PrintMetrics(),
               ModelCheckpoint(dirpath="out/lightning_resnet_ema", monitor="val_acc", mode="max", save_top_k=1)])
trainer.fit(model, train_loader, val_loader)          # 4 epochs x 16 batches / 2 = 32 optimizer steps
print("optimizer steps:", trainer.global_step)
trainer.test(model, dataloaders=test_loader, verbose=False)
print("test (EMA weights):", {k: round(float(v), 4) for k, v in trainer.callback_metrics.items() if k.startswith("test")})
