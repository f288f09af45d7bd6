"""Healthy probe: the Lightning docs' checkpointing and evaluation guides on an LSTM text classifier: configure_optimizers returning an lr_scheduler dict with interval="step" (linear warm-up then decay in a LambdaLR), accumulate_grad_batches=2, validation every 3 optimizer steps through val_check_interval, a ModelCheckpoint callback monitoring val_loss into a temporary directory (save_top_k=1), and trainer.test(ckpt_path="best") after fit(), which restores the best checkpoint before testing.

Token ids are random; the label is whether a marker token occurs in the first half.
"""
import tempfile

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

SEED, VOCAB, LENGTH, MARK = 0, 50, 14, 7
L.seed_everything(SEED, verbose=False)


def sentences(n, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (n, LENGTH), generator=g)
    ids[ids == MARK] = MARK + 1
    labels = torch.randint(0, 2, (n,), generator=g)
    pos = torch.randint(0, LENGTH // 2, (n,), generator=g)
    ids[labels.bool(), pos[labels.bool()]] = MARK
    return torch.utils.data.TensorDataset(ids, labels)


class LSTMClassifier(L.LightningModule):
    def __init__(self, lr=3e-3, warmup=2, total=9):
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(VOCAB, 16, padding_idx=0)
        self.lstm = nn.LSTM(16, 24, batch_first=True)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(24, 2)

    def forward(self, ids):
        _, (h, _) = self.lstm(self.embed(ids))
        return self.head(self.drop(h[-1]))

    def _shared(self, batch, stage):
        ids, y = batch
        logits = self(ids)
        loss = F.cross_entropy(logits, y)
        self.log(f"{stage}_loss", loss, prog_bar=True)
        self.log(f"{stage}_acc", (logits.argmax(1) == y).float().mean())
        return loss

    def training_step(self, batch, batch_idx):
        return self._shared(batch, "train")

    def validation_step(self, batch, batch_idx):
        self._shared(batch, "val")

    def test_step(self, batch, batch_idx):
        self._shared(batch, "test")

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.01)
        warmup, total = self.hparams.warmup, self.hparams.total

        def linear(step):
            return (step + 1) / warmup if step < warmup else max(0.0, (total - step) / (total - warmup))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, linear)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 1}}


train = torch.utils.data.DataLoader(sentences(160, 1), batch_size=8, shuffle=True)
val = torch.utils.data.DataLoader(sentences(48, 2), batch_size=16)
test = torch.utils.data.DataLoader(sentences(48, 3), batch_size=16)
ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=tempfile.mkdtemp(), monitor="val_loss", mode="min", save_top_k=1,
                                           filename="lstm-{step}-{val_loss:.3f}")
trainer = L.Trainer(max_steps=9, accumulate_grad_batches=2, val_check_interval=6, callbacks=[ckpt], logger=False,
                    enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1,
                    num_sanity_val_steps=1)
model = LSTMClassifier()
trainer.fit(model, train, val)
print("best", ckpt.best_model_path, float(ckpt.best_model_score))
print(trainer.test(model, dataloaders=test, ckpt_path="best", verbose=False))
