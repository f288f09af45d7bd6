"""Tabular MLP with categorical embeddings; ReduceLROnPlateau monitors validation accuracy in its default 'min' mode.

Bug class: learning-rate schedule driven by a metric in the wrong direction.

Modelled on: md-mohaiminul/ViS4mer #4 "ReduceLROnPlateau" (``ReduceLROnPlateau``
built with the default ``mode='min'`` and stepped with validation accuracy; the
author agreed it was not intended and suggested ``mode='max'``) and
IntelLabs/distiller #240 "support ReduceLRonPlateau(mode='max') in classifier.py"
(loss vs. top-1 passed to the scheduler).  In 'min' mode a *rising* accuracy
counts as "no improvement", so the scheduler cuts the learning rate exactly while
the model is getting better.

What goes wrong: after the first epochs of improving accuracy the learning rate is
multiplied by 0.3, and again every (patience + 1) epochs while accuracy keeps
rising, so training slows to a crawl.  The loss still decreases; no warning.

Healthy twin: ``ReduceLROnPlateau(optimizer, mode="max", ...)`` on the same
accuracy (it never cuts the rate in this run).

Onset: 768 training rows / batch 64 = 12 optimizer steps per epoch.  patience = 1:
validation accuracy rises after epochs 1 and 2, so the 'min'-mode scheduler sees two
epochs without a new minimum and cuts the rate at the end of epoch 2; the first step
run with the reduced rate is the first step of epoch 3, K = 3 * 12 = 36 (the program
prints it when it sees the rate drop).  7 epochs = 84 optimizer steps.
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)
torch.manual_seed(0)

N_TRAIN, N_VAL = 768, 384
N_NUM = 8
CARDS = [12, 7, 30]
BATCH = 64
EPOCHS = 7


def make_table(n, gen, proj):
    num = torch.randn(n, N_NUM, generator=gen)
    cats = torch.stack([torch.randint(0, c, (n,), generator=gen) for c in CARDS], 1)
    cat_effect = sum(proj["cat"][j][cats[:, j]] for j in range(len(CARDS)))
    logits = num @ proj["num"] + torch.tanh(num[:, :2]).sum(1, keepdim=True) * proj["nl"] + cat_effect
    y = (logits + 0.5 * torch.randn(n, 3, generator=gen)).argmax(1)
    return num, cats, y


class TabularMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.embs = nn.ModuleList([nn.Embedding(c, min(8, (c + 1) // 2)) for c in CARDS])
        emb_dim = sum(e.embedding_dim for e in self.embs)
        self.bn_num = nn.BatchNorm1d(N_NUM)
        self.mlp = nn.Sequential(
            nn.Linear(N_NUM + emb_dim, 64), nn.ReLU(), nn.Dropout(0.1),
            nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 3))

    def forward(self, num, cats):
        e = [emb(cats[:, j]) for j, emb in enumerate(self.embs)]
        return self.mlp(torch.cat([self.bn_num(num)] + e, 1))


def main():
    gen = torch.Generator().manual_seed(21)
    proj = {"num": torch.randn(N_NUM, 3, generator=gen), "nl": torch.randn(1, 3, generator=gen),
            "cat": [torch.randn(c, 3, generator=gen) for c in CARDS]}
    tr = make_table(N_TRAIN, gen, proj)
    va = make_table(N_VAL, gen, proj)
    loader = DataLoader(TensorDataset(*tr), batch_size=BATCH, shuffle=True,
                        generator=torch.Generator().manual_seed(2))

    model = TabularMLP()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
    if HEALTHY:
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", factor=0.3, patience=1)
    else:
        # BUG: default mode='min', but the monitored quantity is an accuracy
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.3, patience=1)

    step = 0
    base_lr = optimizer.param_groups[0]["lr"]
    onset_printed = False
    for epoch in range(EPOCHS):
        model.train()
        tot = 0.0
        for num, cats, y in loader:
            if not HEALTHY and not onset_printed and optimizer.param_groups[0]["lr"] < base_lr:
                print(f"ONSET step {step}")
                onset_printed = True
            loss = F.cross_entropy(model(num, cats), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            tot += loss.item()
            step += 1
        model.eval()
        with torch.no_grad():
            val_acc = (model(va[0], va[1]).argmax(1) == va[2]).float().mean().item()
        scheduler.step(val_acc)
        print(f"epoch {epoch} steps {step} loss {tot / len(loader):.4f} val_acc {val_acc:.4f} "
              f"lr {optimizer.param_groups[0]['lr']:.2e}")
    print("done")


if __name__ == "__main__":
    main()
