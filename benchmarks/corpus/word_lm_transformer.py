"""Word-level Transformer language model (causal TransformerEncoder) with Adam and plateau annealing.

Modelled on: pytorch/examples word_language_model, the `--model Transformer` path of
main.py/model.py plus generate.py (https://github.com/pytorch/examples/tree/main/word_language_model).
Habits reproduced: sinusoidal PositionalEncoding kept in a registered buffer, a causal
mask from nn.Transformer.generate_square_subsequent_mask rebuilt only when the sequence
length changes, seq-first batchify()/get_batch(), log_softmax + NLLLoss, clip_grad_norm_,
evaluate() under model.eval()/torch.no_grad() each pseudo-epoch, best state_dict saved
and reloaded, then sampling words with torch.multinomial like generate.py.
"""

import argparse
import math
import os
import tempfile

import torch
import torch.nn as nn
import torch.utils.checkpoint
import torch.nn.functional as F


class PositionalEncoding(nn.Module):
    r"""Inject information about the relative or absolute position of the tokens in the
    sequence, using sine and cosine functions of different frequencies."""

    def __init__(self, d_model, dropout=0.1, max_len=500):
        super(PositionalEncoding, self).__init__()
        self.dropout = nn.Dropout(p=dropout)
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        pe = pe.unsqueeze(0).transpose(0, 1)
        self.register_buffer("pe", pe)

    def forward(self, x):
        x = x + self.pe[:x.size(0), :]
        return self.dropout(x)


class TransformerModel(nn.Module):
    """Container module with an encoder, a stack of causal self-attention layers, and a decoder."""

    def __init__(self, ntoken, ninp, nhead, nhid, nlayers, dropout=0.5, checkpoint_encoder=False):
        super(TransformerModel, self).__init__()
        self.checkpoint_encoder = checkpoint_encoder
        self.model_type = "Transformer"
        self.src_mask = None
        self.pos_encoder = PositionalEncoding(ninp, dropout)
        encoder_layers = nn.TransformerEncoderLayer(ninp, nhead, nhid, dropout)
        self.transformer_encoder = nn.TransformerEncoder(encoder_layers, nlayers, enable_nested_tensor=False)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.ninp = ninp
        self.decoder = nn.Linear(ninp, ntoken)
        self.init_weights()

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, src, has_mask=True):
        if has_mask:
            if self.src_mask is None or self.src_mask.size(0) != len(src):
                self.src_mask = nn.Transformer.generate_square_subsequent_mask(len(src)).to(src.device)
        else:
            self.src_mask = None
        src = self.encoder(src) * math.sqrt(self.ninp)
        src = self.pos_encoder(src)
        if self.checkpoint_encoder and self.training and torch.is_grad_enabled():
            # keep only the encoder's input; recompute its layers (and dropout) in the backward
            output = torch.utils.checkpoint.checkpoint(self.transformer_encoder, src, self.src_mask,
                                                       use_reentrant=False)
        else:
            output = self.transformer_encoder(src, self.src_mask)
        output = self.decoder(output)
        return F.log_softmax(output, dim=-1)


def markov_stream(ntokens, length, transition, generator):
    ids = torch.empty(length, dtype=torch.long)
    word = 0
    for i in range(length):
        word = int(torch.multinomial(transition[word], 1, generator=generator))
        ids[i] = word
    return ids


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous()


def get_batch(source, i, bptt):
    seq_len = min(bptt, len(source) - 1 - i)
    data = source[i:i + seq_len]
    target = source[i + 1:i + 1 + seq_len].view(-1)
    return data, target


def evaluate(model, criterion, data_source, bptt, ntokens):
    model.eval()
    total_loss = 0.
    with torch.no_grad():
        for i in range(0, data_source.size(0) - 1, bptt):
            data, targets = get_batch(data_source, i, bptt)
            output = model(data)
            output = output.view(-1, ntokens)
            total_loss += len(data) * criterion(output, targets).item()
    return total_loss / (len(data_source) - 1)


def generate(model, ntokens, nwords, temperature=1.0):
    """Sample a continuation word by word, as generate.py does for the Transformer."""
    model.eval()
    input = torch.randint(ntokens, (1, 1), dtype=torch.long)
    words = []
    with torch.no_grad():
        for _ in range(nwords):
            output = model(input, False)
            word_weights = output[-1].squeeze().div(temperature).exp()
            word_idx = torch.multinomial(word_weights, 1)[0]
            word_tensor = torch.Tensor([[word_idx]]).long()
            input = torch.cat([input, word_tensor], 0)
            words.append(int(word_idx))
    return words


def main():
    parser = argparse.ArgumentParser(description="PyTorch Transformer language model (synthetic corpus)")
    parser.add_argument("--steps", type=int, default=60, help="total optimizer steps")
    parser.add_argument("--seed", type=int, default=1111, help="random seed")
    parser.add_argument("--emsize", type=int, default=32)
    parser.add_argument("--nhid", type=int, default=64, help="feed-forward width")
    parser.add_argument("--nlayers", type=int, default=2)
    parser.add_argument("--nhead", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--clip", type=float, default=0.25)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--bptt", type=int, default=16)
    parser.add_argument("--dropout", type=float, default=0.2)
    parser.add_argument("--epoch_batches", type=int, default=3, help="batches between validation passes")
    parser.add_argument("--words", type=int, default=12, help="words to sample after training")
    parser.add_argument("--checkpoint-encoder", action="store_true", help="activation checkpointing of the encoder")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    data_gen = torch.Generator().manual_seed(args.seed)
    ntokens = 33
    transition = torch.softmax(torch.randn(ntokens, ntokens, generator=data_gen) * 3.0, dim=1)
    train_data = batchify(markov_stream(ntokens, 2400, transition, data_gen), args.batch_size)
    val_data = batchify(markov_stream(ntokens, 400, transition, data_gen), 8)

    model = TransformerModel(ntokens, args.emsize, args.nhead, args.nhid, args.nlayers, args.dropout,
                             args.checkpoint_encoder)
    criterion = nn.NLLLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    # plays the part of main.py's "lr /= 4 when validation stalls"
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=0.25, patience=0)

    checkpoint = os.path.join(tempfile.mkdtemp(prefix="transformer_lm_"), "best.pt")
    best_val_loss = float("inf")
    step = 0
    epoch = 0
    while step < args.steps:
        epoch += 1
        model.train()
        total_loss = 0.
        nbatches = 0
        for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
            if batch == args.epoch_batches or step == args.steps:
                break
            data, targets = get_batch(train_data, i, args.bptt)
            optimizer.zero_grad()
            output = model(data)
            output = output.view(-1, ntokens)
            loss = criterion(output, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            optimizer.step()
            step += 1
            nbatches += 1
            total_loss += loss.item()
        val_loss = evaluate(model, criterion, val_data, args.bptt, ntokens)
        scheduler.step(val_loss)
        print("| epoch {:3d} | train loss {:5.2f} | valid loss {:5.2f} | valid ppl {:8.2f} | lr {:.2e}".format(
            epoch, total_loss / max(nbatches, 1), val_loss, math.exp(val_loss), optimizer.param_groups[0]["lr"]))
        if val_loss < best_val_loss:
            torch.save(model.state_dict(), checkpoint)
            best_val_loss = val_loss

    model.load_state_dict(torch.load(checkpoint))
    os.remove(checkpoint)
    os.rmdir(os.path.dirname(checkpoint))
    print("best valid loss {:5.2f}".format(evaluate(model, criterion, val_data, args.bptt, ntokens)))
    print("sample:", " ".join("w%d" % w for w in generate(model, ntokens, args.words)))


if __name__ == "__main__":
    main()
