"""Character-level RNN language model trained with truncated BPTT and an orthogonal
recurrent matrix.

Modelled on pytorch/examples word_language_model/main.py (batchify, get_batch with bptt
windows, repackage_hidden between windows, clip_grad_norm_) combined with the
orthogonal-RNN recipe of Lezcano-Casado's expRNN as expressed through
torch.nn.utils.parametrizations.orthogonal (PyTorch "Parametrizations" tutorial).

Unusual loop: the hidden state crosses optimizer steps but is detached at every window
boundary, the recurrent weight is a parametrization (the optimizer sees the unconstrained
'original' tensor), the output layer uses weight_norm, and the LR is cut by
ReduceLROnPlateau on validation loss once per epoch; parametrize.cached() keeps the
matrix exponential to one evaluation per window.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import parametrizations as P
from torch.nn.utils import parametrize

torch.set_num_threads(1)
torch.manual_seed(0)

# ---- synthetic corpus: a small grammar of words so there is structure to learn ----
words = ["the", "cat", "dog", "sat", "ran", "on", "mat", "log", "and", "then", "slept", "fast"]
g = torch.Generator().manual_seed(3)
nxt = {
    "the": ["cat", "dog", "mat", "log"], "cat": ["sat", "ran", "slept"], "dog": ["sat", "ran", "slept"],
    "sat": ["on", "and"], "ran": ["fast", "on", "and"], "on": ["the"], "mat": ["and", "then"],
    "log": ["and", "then"], "and": ["the", "then"], "then": ["the"], "slept": ["and", "then"],
    "fast": ["and", "then"],
}
w, toks = "the", []
for _ in range(5000):
    toks.append(w)
    opts = nxt[w]
    w = opts[torch.randint(len(opts), (1,), generator=g).item()]
text = " ".join(toks)
chars = sorted(set(text))
stoi = {c: i for i, c in enumerate(chars)}
data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
n_train = int(len(data) * 0.9)
train_data, val_data = data[:n_train], data[n_train:]
VOCAB = len(chars)


def batchify(d, bsz):
    nb = d.size(0) // bsz
    return d[: nb * bsz].view(bsz, -1).t().contiguous()  # [T, B]


def get_batch(src, i, bptt):
    seq_len = min(bptt, len(src) - 1 - i)
    return src[i:i + seq_len], src[i + 1:i + 1 + seq_len]


class OrthoRNN(nn.Module):
    def __init__(self, vocab, emb=32, hid=128):
        super().__init__()
        self.hid = hid
        self.emb = nn.Embedding(vocab, emb)
        self.inp = nn.Linear(emb, hid)
        self.rec = nn.Linear(hid, hid, bias=False)
        P.orthogonal(self.rec, "weight")
        self.out = P.weight_norm(nn.Linear(hid, vocab))

    def init_hidden(self, bsz):
        return torch.zeros(bsz, self.hid)

    def forward(self, x, h):
        e = self.inp(self.emb(x))  # [T, B, H]
        outs = []
        # compute the orthogonal matrix once per window instead of once per time step
        with parametrize.cached():
            for t in range(x.size(0)):
                h = torch.tanh(e[t] + self.rec(h))
                outs.append(h)
        return self.out(torch.stack(outs)), h


def repackage_hidden(h):
    return h.detach()


BSZ, BPTT = 16, 35
train_src, val_src = batchify(train_data, BSZ), batchify(val_data, 8)
model = OrthoRNN(VOCAB)
opt = torch.optim.RMSprop(model.parameters(), lr=2e-3)
plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", factor=0.5, patience=0)


def evaluate(src):
    model.eval()
    h = model.init_hidden(src.size(1))
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, src.size(0) - 1, BPTT):
            x, y = get_batch(src, i, BPTT)
            logits, h = model(x, h)
            total += F.cross_entropy(logits.view(-1, VOCAB), y.reshape(-1), reduction="sum").item()
            count += y.numel()
    return total / count


steps = 0
for epoch in range(3):
    model.train()
    h = model.init_hidden(BSZ)
    run_loss, n = 0.0, 0
    for i in range(0, train_src.size(0) - 1, BPTT):
        x, y = get_batch(train_src, i, BPTT)
        h = repackage_hidden(h)
        logits, h = model(x, h)
        loss = F.cross_entropy(logits.view(-1, VOCAB), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        steps += 1
        run_loss += loss.item()
        n += 1
        if steps % 25 == 0:
            print(f"epoch {epoch} step {steps} train loss {run_loss / n:.3f}")
            run_loss, n = 0.0, 0
    val = evaluate(val_src)
    plateau.step(val)
    W = model.rec.weight
    ortho_err = (W @ W.t() - torch.eye(W.size(0))).abs().max().item()
    print(f"epoch {epoch} val loss {val:.3f} ppl {math.exp(val):.2f} lr {opt.param_groups[0]['lr']:.1e} "
          f"|WW^T-I| {ortho_err:.1e}")
print("optimizer steps:", steps)
