"""Accelerate training of a GRU encoder and an attention GRU decoder as two separate
models with two optimizers, feeding the decoder step by step.

Modelled on the PyTorch tutorial "NLP From Scratch: Translation with a Sequence
to Sequence Network and Attention" (``EncoderRNN`` + ``AttnDecoderRNN`` with
Bahdanau attention, ``encoder_optimizer`` and ``decoder_optimizer`` each zeroed
and stepped every batch, NLLLoss over log-softmax outputs, teacher forcing),
ported to Hugging Face Accelerate the way the accelerate README shows
(``accelerator.prepare`` on every model/optimizer/loader, ``accelerator.backward``,
``accelerator.clip_grad_norm_``).  Task: "translate" a token sequence into its
reversal with a fixed token mapping.

Unusual about the loop: two models prepared separately and updated by two
optimizers from one loss; the decoder is unrolled in Python one token at a time,
and each batch chooses at random between teacher forcing (feed the gold token)
and free running (feed its own argmax, detached), so the graph shape varies
between steps.  6 epochs x 16 steps = 96 steps.
"""
import random

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset

SOS, EOS, VOCAB, LEN = 0, 1, 20, 8


def make_pairs(n, seed):
    g = torch.Generator().manual_seed(seed)
    mapping = torch.randperm(VOCAB - 2, generator=torch.Generator().manual_seed(7)) + 2
    src = torch.randint(2, VOCAB, (n, LEN), generator=g)
    tgt = mapping[(src.flip(1) - 2)]
    eos = torch.full((n, 1), EOS)
    return TensorDataset(torch.cat([src, eos], 1), torch.cat([tgt, eos], 1))


class EncoderRNN(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, hidden)
        self.gru = nn.GRU(hidden, hidden, batch_first=True)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x):
        return self.gru(self.dropout(self.embedding(x)))


class BahdanauAttention(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.Wa, self.Ua, self.Va = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, 1)

    def forward(self, query, keys):
        scores = self.Va(torch.tanh(self.Wa(query) + self.Ua(keys))).squeeze(2).unsqueeze(1)
        weights = F.softmax(scores, dim=-1)
        return torch.bmm(weights, keys), weights


class AttnDecoderRNN(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, hidden)
        self.attention = BahdanauAttention(hidden)
        self.gru = nn.GRU(2 * hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, VOCAB)
        self.dropout = nn.Dropout(0.1)

    def step(self, inp, hidden, enc_out):
        emb = self.dropout(self.embedding(inp))
        ctx, _ = self.attention(hidden.permute(1, 0, 2), enc_out)
        out, hidden = self.gru(torch.cat([emb, ctx], 2), hidden)
        return self.out(out), hidden

    def forward(self, enc_out, enc_hidden, target=None, max_len=LEN + 1):
        b = enc_out.size(0)
        inp = torch.full((b, 1), SOS, dtype=torch.long)
        hidden, outputs = enc_hidden, []
        for i in range(max_len):
            out, hidden = self.step(inp, hidden, enc_out)
            outputs.append(out)
            if target is not None:
                inp = target[:, i].unsqueeze(1)
            else:
                inp = out.argmax(-1).detach()
        return F.log_softmax(torch.cat(outputs, 1), dim=-1)


def main():
    torch.set_num_threads(1)
    set_seed(0)
    accelerator = Accelerator(cpu=True)
    hidden = 64
    encoder, decoder = EncoderRNN(hidden), AttnDecoderRNN(hidden)
    enc_opt = torch.optim.Adam(encoder.parameters(), lr=3e-3)
    dec_opt = torch.optim.Adam(decoder.parameters(), lr=3e-3)
    train_dl = DataLoader(make_pairs(512, 1), batch_size=32, shuffle=True)
    val_dl = DataLoader(make_pairs(128, 2), batch_size=128)
    encoder, decoder, enc_opt, dec_opt, train_dl, val_dl = accelerator.prepare(
        encoder, decoder, enc_opt, dec_opt, train_dl, val_dl)
    criterion = nn.NLLLoss()
    rng = random.Random(0)
    teacher_forcing_ratio = 0.5

    for epoch in range(6):
        encoder.train(); decoder.train()
        total, n = 0.0, 0
        for src, tgt in train_dl:
            enc_opt.zero_grad()
            dec_opt.zero_grad()
            enc_out, enc_hidden = encoder(src)
            use_tf = rng.random() < teacher_forcing_ratio
            log_probs = decoder(enc_out, enc_hidden, target=tgt if use_tf else None)
            loss = criterion(log_probs.reshape(-1, VOCAB), tgt.reshape(-1))
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(encoder.parameters(), 1.0)
            accelerator.clip_grad_norm_(decoder.parameters(), 1.0)
            enc_opt.step()
            dec_opt.step()
            total += loss.item(); n += 1

        encoder.eval(); decoder.eval()
        with torch.no_grad():
            src, tgt = next(iter(val_dl))
            enc_out, enc_hidden = encoder(src)
            pred = decoder(enc_out, enc_hidden).argmax(-1)
            tok_acc = (pred == tgt).float().mean().item()
        accelerator.print(f"epoch {epoch} train_loss {total / n:.4f} greedy_token_acc {tok_acc:.3f}")


if __name__ == "__main__":
    main()
