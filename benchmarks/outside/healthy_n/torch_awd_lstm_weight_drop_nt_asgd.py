"""AWD-LSTM word-level language model with WeightDrop, NT-ASGD and a finetune pass.

Modelled on: salesforce/awd-lstm-lm (``main.py``, ``finetune.py``, ``weight_drop.py``,
``embed_regularize.py``, ``locked_dropout.py``; Merity, Keskar & Socher, "Regularizing and
Optimizing LSTM Language Models", ICLR 2018).

What is unusual about the loop (all deliberate, as in the original):
  * WeightDrop (DropConnect on the LSTM hidden-to-hidden matrices), done here with
    ``torch.func.functional_call`` instead of swapping a dropped tensor into the module.
  * Variable-length BPTT; the param group's lr is rescaled by ``seq_len / bptt`` for each batch and
    restored right after ``optimizer.step()``.
  * NT-ASGD: plain SGD, replaced mid-run by a brand-new ``torch.optim.ASGD`` when validation stops
    improving.  While ASGD is active the averaged iterate ``state['ax']`` is copied *into* the
    parameters for evaluation/checkpointing, and the raw weights are copied back afterwards.
  * ``finetune.py`` stage: the best checkpoint is reloaded from disk and training resumes with a
    fresh ASGD optimizer.  Plus AR/TAR, embedding dropout, locked dropout, tied weights.
"""
import argparse
import math
import os
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call

torch.set_num_threads(1)


# ----------------------------------------------------------------------------- data
def make_corpus(n_tokens, vocab, rng):
    """Synthetic 'text' from a sparse first-order Markov chain (a stand-in for PTB)."""
    succ = np.random.default_rng(1234).integers(0, vocab, size=(vocab, 2))  # fixed 'grammar'
    out = [int(rng.integers(vocab))]
    for _ in range(n_tokens - 1):
        r = rng.random()
        if r < 0.05:
            out.append(int(rng.integers(vocab)))
        else:
            out.append(int(succ[out[-1], 0 if r < 0.8 else 1]))
    return torch.tensor(out, dtype=torch.long)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous()


def get_batch(source, i, seq_len):
    seq_len = min(seq_len, len(source) - 1 - i)
    data = source[i:i + seq_len]
    target = source[i + 1:i + 1 + seq_len].reshape(-1)
    return data, target


def repackage_hidden(h):
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


# ----------------------------------------------------------------------------- model
class LockedDropout(nn.Module):
    def forward(self, x, dropout=0.5):
        if not self.training or not dropout:
            return x
        m = x.new_empty(1, x.size(1), x.size(2)).bernoulli_(1 - dropout)
        return x * m / (1 - dropout)


def embedded_dropout(embed, words, dropout=0.1):
    if dropout:
        mask = embed.weight.new_empty((embed.weight.size(0), 1)).bernoulli_(1 - dropout)
        weight = mask.expand_as(embed.weight) / (1 - dropout) * embed.weight
    else:
        weight = embed.weight
    return F.embedding(words, weight, embed.padding_idx)


class WeightDrop(nn.Module):
    """DropConnect on named weights of a wrapped RNN (Wan et al., 2013)."""

    def __init__(self, module, weights, dropout=0.0):
        super().__init__()
        self.module = module
        self.weights = weights
        self.dropout = dropout

    def forward(self, *args):
        if self.training and self.dropout > 0:
            dropped = {name: F.dropout(getattr(self.module, name), p=self.dropout, training=True)
                       for name in self.weights}
            return functional_call(self.module, dropped, args)
        return self.module(*args)


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.4, dropouth=0.25, dropouti=0.4,
                 dropoute=0.1, wdrop=0.5):
        super().__init__()
        self.lockdrop = LockedDropout()
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnns = nn.ModuleList([
            WeightDrop(nn.LSTM(ninp if l == 0 else nhid, nhid if l != nlayers - 1 else ninp, 1),
                       ["weight_hh_l0"], dropout=wdrop)
            for l in range(nlayers)])
        self.decoder = nn.Linear(ninp, ntoken)
        self.decoder.weight = self.encoder.weight  # weight tying
        self.ninp, self.nhid, self.nlayers = ninp, nhid, nlayers
        self.dropout, self.dropouth, self.dropouti, self.dropoute = dropout, dropouth, dropouti, dropoute
        self.encoder.weight.data.uniform_(-0.1, 0.1)
        self.decoder.bias.data.fill_(0)

    def forward(self, inp, hidden, return_h=False):
        emb = embedded_dropout(self.encoder, inp, dropout=self.dropoute if self.training else 0)
        emb = self.lockdrop(emb, self.dropouti)
        raw_output, new_hidden, raw_outputs, outputs = emb, [], [], []
        for l, rnn in enumerate(self.rnns):
            raw_output, new_h = rnn(raw_output, hidden[l])
            new_hidden.append(new_h)
            raw_outputs.append(raw_output)
            if l != self.nlayers - 1:
                raw_output = self.lockdrop(raw_output, self.dropouth)
                outputs.append(raw_output)
        output = self.lockdrop(raw_output, self.dropout)
        outputs.append(output)
        result = output.view(-1, output.size(2))
        if return_h:
            return result, new_hidden, raw_outputs, outputs
        return result, new_hidden

    def init_hidden(self, bsz):
        sizes = [self.nhid if l != self.nlayers - 1 else self.ninp for l in range(self.nlayers)]
        return [(torch.zeros(1, bsz, h), torch.zeros(1, bsz, h)) for h in sizes]


# ----------------------------------------------------------------------------- main
parser = argparse.ArgumentParser(description="AWD-LSTM (synthetic corpus)")
for name, default in dict(emsize=48, nhid=96, nlayers=2, lr=30.0, clip=0.25, epochs=3, finetune_epochs=1,
                          batch_size=20, bptt=35, alpha=2.0, beta=1.0, wdecay=1.2e-6, nonmono=1, seed=141).items():
    parser.add_argument(f"--{name}", type=type(default), default=default)
args = parser.parse_args()

np.random.seed(args.seed)
torch.manual_seed(args.seed)
rng = np.random.default_rng(args.seed)
ntokens = 60
train_data = batchify(make_corpus(12000, ntokens, rng), args.batch_size)
eval_batch_size = 10
val_data = batchify(make_corpus(2000, ntokens, rng), eval_batch_size)
test_data = batchify(make_corpus(2000, ntokens, rng), 1)

model = RNNModel(ntokens, args.emsize, args.nhid, args.nlayers)
criterion = nn.CrossEntropyLoss()
params = list(model.parameters())
print("Model total parameters:", sum(p.numel() for p in params))
save_path = os.path.join(tempfile.mkdtemp(prefix="awd_"), "model.pt")


def model_save(fn):
    with open(fn, "wb") as f:
        torch.save([model.state_dict(), criterion, optimizer.state_dict()], f)


def model_load(fn):
    with open(fn, "rb") as f:
        state, _, _ = torch.load(f, weights_only=False)
    model.load_state_dict(state)


def evaluate(data_source, batch_size=10):
    model.eval()
    total_loss = 0.0
    hidden = model.init_hidden(batch_size)
    with torch.no_grad():
        for i in range(0, data_source.size(0) - 1, args.bptt):
            data, targets = get_batch(data_source, i, args.bptt)
            output, hidden = model(data, hidden)
            total_loss += len(data) * criterion(model.decoder(output), targets).item()
            hidden = repackage_hidden(hidden)
    return total_loss / len(data_source)


def train(epoch):
    total_loss, start = 0.0, time.time()
    hidden = model.init_hidden(args.batch_size)
    batch, i = 0, 0
    while i < train_data.size(0) - 1 - 1:
        bptt = args.bptt if np.random.random() < 0.95 else args.bptt / 2.0
        seq_len = max(5, int(np.random.normal(bptt, 5)))
        lr2 = optimizer.param_groups[0]["lr"]
        optimizer.param_groups[0]["lr"] = lr2 * seq_len / args.bptt
        model.train()
        data, targets = get_batch(train_data, i, seq_len)
        hidden = repackage_hidden(hidden)
        optimizer.zero_grad()
        output, hidden, rnn_hs, dropped_rnn_hs = model(data, hidden, return_h=True)
        raw_loss = criterion(model.decoder(output), targets)
        loss = raw_loss
        loss = loss + sum(args.alpha * h.pow(2).mean() for h in dropped_rnn_hs[-1:])
        loss = loss + sum(args.beta * (h[1:] - h[:-1]).pow(2).mean() for h in rnn_hs[-1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, args.clip)
        optimizer.step()
        optimizer.param_groups[0]["lr"] = lr2
        total_loss += raw_loss.item()
        batch += 1
        i += seq_len
        if batch % 8 == 0:
            cur = total_loss / 8
            print(f"| epoch {epoch:3d} | {batch:3d} batches | lr {lr2:6.2f} | "
                  f"ms/batch {(time.time() - start) * 1000 / 8:6.1f} | loss {cur:5.2f} | ppl {math.exp(cur):7.2f}")
            total_loss, start = 0.0, time.time()


def evaluate_with_averaged_weights():
    """ASGD: evaluate (and checkpoint) the averaged iterate, then restore the raw weights."""
    tmp = {}
    for prm in model.parameters():
        tmp[prm] = prm.data.clone()
        prm.data = optimizer.state[prm]["ax"].clone()
    val_loss2 = evaluate(val_data, eval_batch_size)
    improved = val_loss2 < stored_loss
    if improved:
        model_save(save_path)
        print("Saving Averaged (new best validation)")
    for prm in model.parameters():
        prm.data = tmp[prm].clone()
    return val_loss2, improved


optimizer = torch.optim.SGD(params, lr=args.lr, weight_decay=args.wdecay)
best_val_loss, stored_loss = [], float("inf")
for epoch in range(1, args.epochs + 1):
    epoch_start = time.time()
    train(epoch)
    if "t0" in optimizer.param_groups[0]:
        val_loss, improved = evaluate_with_averaged_weights()
        if improved:
            stored_loss = val_loss
    else:
        val_loss = evaluate(val_data, eval_batch_size)
        if val_loss < stored_loss:
            model_save(save_path)
            print("Saving model (new best validation)")
            stored_loss = val_loss
        if (len(best_val_loss) > args.nonmono and val_loss > min(best_val_loss[:-args.nonmono])):
            print("Switching to ASGD")
            optimizer = torch.optim.ASGD(params, lr=args.lr, t0=0, lambd=0.0, weight_decay=args.wdecay)
        best_val_loss.append(val_loss)
    print(f"| end of epoch {epoch:3d} | time: {time.time() - epoch_start:5.2f}s | "
          f"valid loss {val_loss:5.2f} | valid ppl {math.exp(val_loss):8.2f}")

# finetune.py: reload the best checkpoint and continue with a fresh ASGD optimizer
model_load(save_path)
optimizer = torch.optim.ASGD(params, lr=args.lr, t0=0, lambd=0.0, weight_decay=args.wdecay)
for epoch in range(args.epochs + 1, args.epochs + args.finetune_epochs + 1):
    train(epoch)
    val_loss, improved = evaluate_with_averaged_weights()
    if improved:
        stored_loss = val_loss
    print(f"| finetune epoch {epoch:3d} | valid loss {val_loss:5.2f} | valid ppl {math.exp(val_loss):8.2f}")

model_load(save_path)
test_loss = evaluate(test_data, 1)
print(f"| End of training | test loss {test_loss:5.2f} | test ppl {math.exp(test_loss):8.2f}")
