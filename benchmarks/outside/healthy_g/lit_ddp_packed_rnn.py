"""Lightning on two CPU processes (strategy="ddp") training a GRU name classifier
over packed variable-length sequences.

Modelled on the PyTorch tutorial "NLP From Scratch: Classifying Names with a
Character-Level RNN" (char sequences -> language class), in the batched form
that uses ``pack_padded_sequence(..., enforce_sorted=False)`` as in many
community ports of it, wrapped in a LightningModule and trained with
``L.Trainer(strategy="ddp", accelerator="cpu", devices=2)`` as in the Lightning
docs on CPU multi-process training.  Run as a plain script: Lightning starts
the second process itself.

Unusual about the loop: each batch is padded to its own longest name, then
packed so the GRU never sees the padding; the final hidden state is taken per
sequence at its true length.  Lightning's DDP strategy adds a
DistributedSampler, so each process sees half of each epoch; metrics are
synced with ``sync_dist=True``.  6 epochs x 10 steps = 60 steps per process.
"""
import random

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_sequence
from torch.utils.data import DataLoader, Dataset

# synthetic "languages": each has its own syllable inventory
SYLLABLES = [
    ["ka", "ta", "mi", "ro", "shi", "na"],
    ["ov", "ski", "ev", "ich", "na", "ko"],
    ["son", "berg", "ls", "ck", "en", "a"],
    ["ez", "ra", "lo", "ita", "do", "es"],
]
CHARS = sorted({c for lang in SYLLABLES for s in lang for c in s})
STOI = {c: i + 1 for i, c in enumerate(CHARS)}  # 0 = padding


class NamesDataset(Dataset):
    def __init__(self, n, seed):
        rng = random.Random(seed)
        self.items = []
        for _ in range(n):
            lang = rng.randrange(len(SYLLABLES))
            name = "".join(rng.choice(SYLLABLES[lang]) for _ in range(rng.randint(1, 5)))
            # 15% of characters are swapped for random ones
            name = "".join(c if rng.random() > 0.15 else rng.choice(CHARS) for c in name)
            self.items.append((torch.tensor([STOI[c] for c in name]), lang))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate(batch):
    seqs, labels = zip(*batch)
    lengths = torch.tensor([len(s) for s in seqs])
    return pad_sequence(seqs, batch_first=True), lengths, torch.tensor(labels)


class NameClassifier(L.LightningModule):
    def __init__(self, hidden=64, lr=5e-3):
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(len(CHARS) + 1, 32, padding_idx=0)
        self.rnn = nn.GRU(32, hidden, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * hidden, len(SYLLABLES))

    def forward(self, x, lengths):
        packed = pack_padded_sequence(self.embed(x), lengths, batch_first=True, enforce_sorted=False)
        _, h = self.rnn(packed)  # h: (2, batch, hidden), already in input order
        return self.out(torch.cat([h[0], h[1]], dim=1))

    def training_step(self, batch, batch_idx):
        x, lengths, y = batch
        loss = F.cross_entropy(self(x, lengths), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, lengths, y = batch
        logits = self(x, lengths)
        self.log("val_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log("val_acc", (logits.argmax(1) == y).float().mean(), sync_dist=True)

    def on_train_epoch_end(self):
        m = self.trainer.callback_metrics
        if self.trainer.is_global_zero and "val_acc" in m:
            print(f"epoch {self.current_epoch} train_loss {m['train_loss']:.4f} "
                  f"val_loss {m['val_loss']:.4f} val_acc {m['val_acc']:.3f}")

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": sched}


def main():
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    train_loader = DataLoader(NamesDataset(640, 1), batch_size=32, shuffle=True, collate_fn=collate)
    val_loader = DataLoader(NamesDataset(160, 2), batch_size=80, collate_fn=collate)
    trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_epochs=6,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(NameClassifier(), train_loader, val_loader)


if __name__ == "__main__":
    main()
