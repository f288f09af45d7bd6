"""Character-level causal Transformer LM with ReZero residuals (no LayerNorm), in Lightning.

Modelled on: majumderb/rezero (``rezero/transformer.py``: ``RZTXEncoderLayer`` with
``self.resweight = nn.Parameter(torch.Tensor([0]))`` scaling each sub-layer before the residual
add, and its char-LM example notebook); Bachlechner, Majumder, Mao, Cottrell & McAuley, "ReZero is
All You Need: Fast Convergence at Large Depth", 2020.

What is unusual about the loop (deliberate):
  * Every residual branch is multiplied by a scalar initialised to exactly 0, so at the first
    step each layer is the identity: the attention and MLP weights receive *exactly zero*
    gradient (printed below) and only the ``resweight`` scalars, the embeddings and the output
    head learn.  Branch weights start moving once the ``resweight``s leave zero.
  * No LayerNorm anywhere in the blocks.
  * Linear warm-up that starts at lr = 0, so the very first optimizer step is a no-op.
  * Validation in the middle of the epoch; at the end the model is saved with
    ``trainer.save_checkpoint`` to a temp dir, restored with ``load_from_checkpoint`` and
    re-evaluated to check the round trip.
"""
import math
import os
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import lightning as L
from torch.utils.data import DataLoader, Dataset

torch.set_num_threads(1)


class RZTXEncoderLayer(nn.Module):
    def __init__(self, d_model, nhead, dim_feedforward=128, dropout=0.1):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d_model, nhead, dropout=dropout, batch_first=True)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.resweight = nn.Parameter(torch.Tensor([0]))

    def forward(self, src, src_mask=None):
        src2 = self.self_attn(src, src, src, attn_mask=src_mask, need_weights=False)[0]
        src = src + self.dropout1(src2 * self.resweight)
        src2 = self.linear2(self.dropout(F.relu(self.linear1(src))))
        src = src + self.dropout2(src2 * self.resweight)
        return src


class ReZeroCharLM(L.LightningModule):
    def __init__(self, vocab_size, d_model=64, nhead=4, nlayers=4, seq_len=64, lr=3e-3, warmup=10,
                 total_steps=60):
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Parameter(torch.randn(seq_len, d_model) * 0.02)
        self.layers = nn.ModuleList([RZTXEncoderLayer(d_model, nhead) for _ in range(nlayers)])
        self.head = nn.Linear(d_model, vocab_size)
        self.register_buffer("causal_mask", torch.triu(torch.full((seq_len, seq_len), float("-inf")), 1),
                             persistent=False)

    def forward(self, x):
        T = x.size(1)
        h = self.embed(x) + self.pos[:T]
        for layer in self.layers:
            h = layer(h, self.causal_mask[:T, :T])
        return self.head(h)

    def _loss(self, batch):
        x, y = batch
        logits = self(x)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("train_loss", loss)
        if batch_idx % 10 == 0:
            rw = [f"{l.resweight.item():+.3f}" for l in self.layers]
            lr = self.trainer.optimizers[0].param_groups[0]["lr"]
            print(f"step {self.global_step:3d} lr {lr:.2e} loss {loss.item():.4f} "
                  f"bpc {loss.item() / math.log(2):.3f} resweights {rw}")
        return loss

    def on_after_backward(self):
        if self.global_step == 0:
            attn_g = self.layers[0].self_attn.in_proj_weight.grad
            mlp_g = self.layers[0].linear1.weight.grad
            print(f"first backward: |grad| attn.in_proj={attn_g.abs().sum().item():.3e} "
                  f"linear1={mlp_g.abs().sum().item():.3e} "
                  f"resweight={self.layers[0].resweight.grad.abs().item():.3e}")

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self._loss(batch), prog_bar=True)

    def on_validation_epoch_end(self):
        if not self.trainer.sanity_checking:
            v = self.trainer.callback_metrics["val_loss"].item()
            print(f"  [validation @ step {self.global_step}] val_loss {v:.4f} bpc {v / math.log(2):.3f}")

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.01)
        w, total = self.hparams.warmup, self.hparams.total_steps
        lam = lambda s: s / w if s < w else max(0.0, (total - s) / max(1, total - w))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lam)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def make_text(n_chars, rng):
    words = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "to", "park", "and", "saw", "bird",
             "big", "red", "ball", "under", "tree", "quick", "fox"]
    out = []
    while sum(len(w) + 1 for w in out) < n_chars:
        out += [words[i] for i in rng.integers(0, len(words), size=int(rng.integers(4, 9)))] + ["."]
    return " ".join(out)[:n_chars]


class CharDataset(Dataset):
    def __init__(self, text, stoi, seq_len):
        self.data = torch.tensor([stoi[c] for c in text])
        self.seq_len = seq_len

    def __len__(self):
        return (len(self.data) - 1) // self.seq_len

    def __getitem__(self, i):
        chunk = self.data[i * self.seq_len: i * self.seq_len + self.seq_len + 1]
        return chunk[:-1], chunk[1:]


def main():
    L.seed_everything(7)
    rng = np.random.default_rng(7)
    train_text, val_text = make_text(64 * 16 * 60 + 1, rng), make_text(64 * 32 + 1, rng)
    chars = sorted(set(train_text + val_text))
    stoi = {c: i for i, c in enumerate(chars)}
    train = DataLoader(CharDataset(train_text, stoi, 64), batch_size=16, shuffle=True)
    val = DataLoader(CharDataset(val_text, stoi, 64), batch_size=32)

    model = ReZeroCharLM(len(chars), total_steps=len(train))
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, val_check_interval=30, gradient_clip_val=1.0,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, train, val)

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = os.path.join(tmp, "rezero.ckpt")
        trainer.save_checkpoint(ckpt)
        restored = ReZeroCharLM.load_from_checkpoint(ckpt)
        before = trainer.validate(model, val, verbose=False)[0]["val_loss"]
        after = trainer.validate(restored, val, verbose=False)[0]["val_loss"]
        print(f"val_loss live {before:.5f} vs restored {after:.5f}")
        assert abs(before - after) < 1e-6


if __name__ == "__main__":
    main()
