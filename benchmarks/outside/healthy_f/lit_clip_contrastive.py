"""CLIP-style contrastive training of an image encoder and a text encoder with a learnable
temperature, in Lightning.

Modelled on mlfoundations/open_clip (src/training/train.py and src/open_clip/loss.py:
symmetric cross-entropy over the image-text similarity matrix scaled by
logit_scale.exp(), logit_scale initialised to log(1/0.07) and clamped to [0, log(100)]
in place right after each optimizer step; parameter groups that exclude gains, biases and
logit_scale from weight decay) written as a LightningModule, with OneCycleLR stepped every
batch through the lr_scheduler config "interval": "step".

Unusual loop: one scalar parameter (the temperature) is shared by both towers, sits in a
no-weight-decay group, and is edited in place under no_grad after every optimizer step
(on_train_batch_end); the loss uses the batch itself as the set of negatives, so its
floor depends on the batch size.
"""
import math
import warnings

import lightning.pytorch as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
warnings.filterwarnings("ignore")
LATENT, SLOTS, OPTS = 12, 6, 10
VOCAB = SLOTS * OPTS + 1
_gen = torch.Generator().manual_seed(42)
IMG_MAP = torch.randn(LATENT, 3 * 12 * 12, generator=_gen) / math.sqrt(LATENT)
TXT_MAP = torch.randn(SLOTS, LATENT, OPTS, generator=_gen)


def make_pairs(n, seed):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, LATENT, generator=g)
    images = (z @ IMG_MAP).view(n, 3, 12, 12) + 0.3 * torch.randn(n, 3, 12, 12, generator=g)
    slot_scores = torch.einsum("nl,slo->nso", z, TXT_MAP)
    tokens = slot_scores.argmax(-1) + torch.arange(SLOTS) * OPTS + 1   # [n, SLOTS]
    return TensorDataset(images, tokens)


class ImageTower(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.GELU(), nn.Conv2d(32, 64, 3, stride=2, padding=1),
                                 nn.GELU(), nn.Flatten(), nn.LayerNorm(64 * 36), nn.Linear(64 * 36, dim))

    def forward(self, x):
        return self.net(x)


class TextTower(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, 64)
        self.pos = nn.Parameter(torch.randn(SLOTS, 64) * 0.02)
        self.layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True, norm_first=True)
        self.ln = nn.LayerNorm(64)
        self.proj = nn.Linear(64, dim, bias=False)

    def forward(self, t):
        h = self.layer(self.tok(t) + self.pos)
        return self.proj(self.ln(h.mean(1)))


class CLIPLite(pl.LightningModule):
    def __init__(self, dim=32, lr=2e-3, wd=0.1, total_steps=100):
        super().__init__()
        self.save_hyperparameters()
        self.visual = ImageTower(dim)
        self.text = TextTower(dim)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))
        self.train_losses = []

    def encode(self, images, tokens):
        return F.normalize(self.visual(images), dim=-1), F.normalize(self.text(tokens), dim=-1)

    def training_step(self, batch, batch_idx):
        img, txt = self.encode(*batch)
        scale = self.logit_scale.exp()
        logits_per_image = scale * img @ txt.t()
        labels = torch.arange(img.size(0))
        loss = 0.5 * (F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_image.t(), labels))
        self.log("train_loss", loss)
        self.log("scale", scale)
        self.train_losses.append(loss.item())
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        with torch.no_grad():
            self.logit_scale.clamp_(0, math.log(100))

    def validation_step(self, batch, batch_idx):
        img, txt = self.encode(*batch)
        sim = img @ txt.t()
        self.log("val_i2t_top1", (sim.argmax(1) == torch.arange(len(sim))).float().mean())

    def configure_optimizers(self):
        exclude = lambda n, p: p.ndim < 2 or "ln" in n or "norm" in n or "bias" in n or "logit_scale" in n
        named = list(self.named_parameters())
        groups = [{"params": [p for n, p in named if exclude(n, p)], "weight_decay": 0.0},
                  {"params": [p for n, p in named if not exclude(n, p)], "weight_decay": self.hparams.wd}]
        opt = torch.optim.AdamW(groups, lr=self.hparams.lr, betas=(0.9, 0.98), eps=1e-6)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=self.hparams.lr, total_steps=self.hparams.total_steps,
                                                    pct_start=0.1)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


pl.seed_everything(0, verbose=False)
train_dl = DataLoader(make_pairs(128 * 30, 1), batch_size=128, shuffle=True, drop_last=True)
val_dl = DataLoader(make_pairs(256, 2), batch_size=256)
EPOCHS = 3
model = CLIPLite(total_steps=EPOCHS * len(train_dl))
trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=EPOCHS, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
before = trainer.validate(model, val_dl, verbose=False)[0]["val_i2t_top1"]
trainer.fit(model, train_dl, val_dl)
L = model.train_losses
print(f"steps {trainer.global_step}; loss by 10 steps:", [round(sum(L[i:i + 10]) / 10, 3) for i in range(0, len(L), 10)])
print(f"logit scale {model.logit_scale.exp().item():.1f}; val image->text top-1 "
      f"{before:.3f} -> {trainer.callback_metrics['val_i2t_top1']:.3f} (chance {1 / 256:.3f})")
