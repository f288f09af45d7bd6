"""Healthy probe: a GRU encoder-decoder in the style of bentrevett/pytorch-seq2seq with an OpenNMT-py-like generator (Linear + LogSoftmax): time-major padded batches packed for the encoder, a decoder loop with teacher forcing chosen by random.random() < ratio, nn.NLLLoss(ignore_index=PAD, reduction="sum") over outputs[1:] divided by the non-pad token count, clip_grad_norm_, greedy evaluation with ratio 0.

Loss-input edges: nll_loss receives the generator's log_softmax output (never a softmax) stacked
and flattened to (T * B, V); padded target positions are ignored through ignore_index.
"""
import argparse
import random

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence

PAD, SOS, EOS, VOCAB = 0, 1, 2, 20


class Encoder(nn.Module):
    def __init__(self, emb=16, hid=32):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, emb, padding_idx=PAD)
        self.rnn = nn.GRU(emb, hid)
        self.dropout = nn.Dropout(0.1)

    def forward(self, src, src_len):                 # src (S, B)
        packed = pack_padded_sequence(self.dropout(self.embedding(src)), src_len, enforce_sorted=False)
        _, hidden = self.rnn(packed)
        return hidden                                 # (1, B, hid)


class Decoder(nn.Module):
    def __init__(self, emb=16, hid=32):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, emb, padding_idx=PAD)
        self.rnn = nn.GRU(emb, hid)
        self.generator = nn.Sequential(nn.Linear(hid, VOCAB), nn.LogSoftmax(dim=-1))

    def forward(self, token, hidden):                # token (B,)
        output, hidden = self.rnn(self.embedding(token).unsqueeze(0), hidden)
        return self.generator(output.squeeze(0)), hidden


class Seq2Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder, self.decoder = Encoder(), Decoder()

    def forward(self, src, src_len, trg, teacher_forcing_ratio=0.5):
        trg_len, batch_size = trg.shape
        outputs = torch.zeros(trg_len, batch_size, VOCAB)
        hidden = self.encoder(src, src_len)
        token = trg[0]
        for t in range(1, trg_len):
            output, hidden = self.decoder(token, hidden)
            outputs[t] = output
            teacher_force = random.random() < teacher_forcing_ratio
            token = trg[t] if teacher_force else output.argmax(1)
        return outputs


def make_batch(gen, batch_size=8):
    """Reverse-the-sequence task, padded time-major: src (S, B), trg (T, B) with SOS ... EOS PAD..."""
    lengths = torch.randint(3, 9, (batch_size,), generator=gen)
    src = torch.full((int(lengths.max()), batch_size), PAD)
    trg = torch.full((int(lengths.max()) + 2, batch_size), PAD)
    for b, n in enumerate(lengths.tolist()):
        seq = torch.randint(3, VOCAB, (n,), generator=gen)
        src[:n, b] = seq
        trg[:n + 2, b] = torch.cat([torch.tensor([SOS]), seq.flip(0), torch.tensor([EOS])])
    return src, lengths, trg


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--teacher-forcing", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    model = Seq2Seq()
    for name, param in model.named_parameters():
        nn.init.uniform_(param.data, -0.08, 0.08)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    criterion = nn.NLLLoss(ignore_index=PAD, reduction="sum")

    for step in range(args.steps):
        model.train()
        src, src_len, trg = make_batch(gen)
        output = model(src, src_len, trg, args.teacher_forcing)
        output_dim = output.shape[-1]
        num_tokens = (trg[1:] != PAD).sum()
        loss = criterion(output[1:].view(-1, output_dim), trg[1:].view(-1)) / num_tokens
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        print(f"step {step + 1} loss {loss.item():.3f}")

    model.eval()
    with torch.no_grad():
        src, src_len, trg = make_batch(gen)
        output = model(src, src_len, trg, 0)                # greedy, no teacher forcing
        val = criterion(output[1:].view(-1, VOCAB), trg[1:].view(-1)) / (trg[1:] != PAD).sum()
        mask = trg[1:] != PAD
        acc = (output[1:].argmax(-1)[mask] == trg[1:][mask]).float().mean()
    print(f"val loss {val.item():.3f} token accuracy {acc.item():.3f}")


if __name__ == "__main__":
    main()
