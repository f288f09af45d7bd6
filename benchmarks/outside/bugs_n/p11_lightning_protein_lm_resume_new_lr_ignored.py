"""Protein-family language model (a small causal Transformer over amino acids) trained with
PyTorch Lightning: AdamW + a warm-up/cosine ``LambdaLR`` stepped every optimizer step.
The run is interrupted after 16 steps (``trainer.save_checkpoint``) and continued with
``trainer.fit(model, ckpt_path=...)`` using a 10x lower learning rate, as one does when the
loss starts to spike.

Modelled on: alex-hh/profam issue #269 "Learning rate can't be updated when using resume train
with ckpt_path" and its fix PR #483 "Optimiser override" ("over-write the learning rate and
scheduler using on_load_checkpoint() ... useful when you want to resume a training run from
a checkpoint but want to try a lower lr"); same mechanism as pytorch/examples#816.  The new
``hparams.lr`` only reaches the freshly built optimizer; Lightning then restores the
optimizer state (param-group ``lr``/``initial_lr``) and the scheduler state (``base_lrs``)
from the checkpoint, so training silently continues on the old schedule.  The fix rewrites
the learning rates inside ``checkpoint['optimizer_states']`` and ``checkpoint['lr_schedulers']``
in ``on_load_checkpoint``.

Unusual about the loop: two ``fit`` calls on two Trainers, the second one resuming mid-run
(global_step restored to 16); per-step LambdaLR; fp32 CPU run; causal mask;
validation perplexity every 8 steps.
Run: python p11_lightning_protein_lm_resume_new_lr_ignored.py [--healthy]
"""
import argparse
import math
import os
import tempfile

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true")
args = parser.parse_args()

AA, SEQ, RESUME_AT, TOTAL, WARMUP = 25, 48, 16, 40, 6


def make_families(n, g):
    profiles = torch.softmax(torch.randn(4, SEQ, AA, generator=torch.Generator().manual_seed(7)) * 3, -1)
    fam = torch.randint(0, 4, (n,), generator=g)
    seqs = torch.multinomial(profiles[fam].reshape(-1, AA), 1, generator=g).reshape(n, SEQ)
    return torch.cat([torch.full((n, 1), AA), seqs], 1)  # BOS token = AA


class ProteinLM(L.LightningModule):
    def __init__(self, lr=1e-3, dim=64):
        super().__init__()
        self.save_hyperparameters()
        self.emb = nn.Embedding(AA + 1, dim)
        self.pos = nn.Parameter(torch.randn(1, SEQ + 1, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, 4, 4 * dim, dropout=0.1, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(dim, AA)
        self.lrs_seen = []

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.size(1))
        return self.head(self.blocks(self.emb(x) + self.pos[:, :x.size(1)], mask=mask, is_causal=True))

    def _loss(self, batch):
        (x,) = batch
        logits = self(x[:, :-1])
        return F.cross_entropy(logits.reshape(-1, AA), x[:, 1:].reshape(-1))

    def on_train_batch_start(self, batch, batch_idx):
        lr = self.trainer.optimizers[0].param_groups[0]["lr"]
        self.lrs_seen.append((self.global_step, lr))
        if self.global_step == RESUME_AT and not args.healthy:
            print(f"ONSET step {self.global_step}")

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        print(f"step {self.global_step} loss {loss.item():.4f} lr {self.lrs_seen[-1][1]:.3e}")
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_ppl", torch.exp(self._loss(batch)))

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.01, betas=(0.9, 0.95))

        def warmup_cosine(step):
            if step < WARMUP:
                return (step + 1) / WARMUP
            return 0.5 * (1 + math.cos(math.pi * (step - WARMUP) / (TOTAL - WARMUP)))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def on_load_checkpoint(self, checkpoint):
        if not args.healthy:
            return
        new_lr = self.hparams.lr  # profam PR #483: override lr and scheduler state on resume
        for opt_state in checkpoint["optimizer_states"]:
            for group in opt_state["param_groups"]:
                scale = group["lr"] / group["initial_lr"]
                group["initial_lr"], group["lr"] = new_lr, new_lr * scale
        for sched_state in checkpoint["lr_schedulers"]:
            scale = sched_state["_last_lr"][0] / sched_state["base_lrs"][0]
            sched_state["base_lrs"] = [new_lr for _ in sched_state["base_lrs"]]
            sched_state["_last_lr"] = [new_lr * scale for _ in sched_state["_last_lr"]]


g = torch.Generator().manual_seed(1)
train = DataLoader(TensorDataset(make_families(512, g)), batch_size=32, shuffle=True,
                   generator=torch.Generator().manual_seed(2))
val = DataLoader(TensorDataset(make_families(128, g)), batch_size=64)
common = dict(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False, val_check_interval=8, num_sanity_val_steps=0)

with tempfile.TemporaryDirectory() as tmp:
    L.seed_everything(0, verbose=False)
    model = ProteinLM(lr=1e-3)
    trainer = L.Trainer(max_steps=RESUME_AT, **common)
    trainer.fit(model, train, val)
    ckpt = os.path.join(tmp, "interrupted.ckpt")
    trainer.save_checkpoint(ckpt)
    print(f"saved checkpoint at global step {trainer.global_step}; resuming with lr 1e-4")

    L.seed_everything(1, verbose=False)
    resumed = ProteinLM(lr=1e-4)
    trainer2 = L.Trainer(max_steps=TOTAL, **common)
    trainer2.fit(resumed, train, val, ckpt_path=ckpt)

first = dict(resumed.lrs_seen)[RESUME_AT]
expected = 1e-4 * 0.5 * (1 + math.cos(math.pi * (RESUME_AT - WARMUP) / (TOTAL - WARMUP)))
print(f"EVIDENCE lr at first resumed step {first:.3e} (requested schedule {expected:.3e}); "
      f"max lr after resume {max(lr for s, lr in resumed.lrs_seen):.3e}; final val_ppl {trainer2.callback_metrics['val_ppl']:.3f}")
