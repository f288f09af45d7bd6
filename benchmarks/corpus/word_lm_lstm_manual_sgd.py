"""Word-level LSTM language model trained with hand-written SGD over truncated BPTT.

Modelled on: pytorch/examples word_language_model, main.py + model.py
(https://github.com/pytorch/examples/tree/main/word_language_model).
Habits reproduced: no torch.optim at all — model.zero_grad(), clip_grad_norm_, then
`p.data.add_(p.grad, alpha=-lr)` over model.parameters(); batchify()/get_batch() over a
flat token stream; hidden state repackaged (detached) between batches; evaluate() with
model.eval() under torch.no_grad() after each "epoch"; best model saved with torch.save
and the learning rate divided by 4 when validation loss stops improving.
"""

import argparse
import math
import os
import shutil
import tempfile
import time

import torch
import torch.nn as nn


class Dictionary(object):
    def __init__(self):
        self.word2idx = {}
        self.idx2word = []

    def add_word(self, word):
        if word not in self.word2idx:
            self.idx2word.append(word)
            self.word2idx[word] = len(self.idx2word) - 1
        return self.word2idx[word]

    def __len__(self):
        return len(self.idx2word)


class Corpus(object):
    """A synthetic stand-in for the Penn Treebank files: sentences drawn from a random
    first-order Markov chain over a small vocabulary, so there is structure to learn."""

    def __init__(self, vocab_size, generator):
        self.dictionary = Dictionary()
        for i in range(vocab_size):
            self.dictionary.add_word("w%d" % i)
        self.dictionary.add_word("<eos>")
        ntokens = len(self.dictionary)
        logits = torch.randn(ntokens, ntokens, generator=generator) * 3.0
        self.transition = torch.softmax(logits, dim=1)
        self.train = self.tokenize(3000, generator)
        self.valid = self.tokenize(600, generator)
        self.test = self.tokenize(600, generator)

    def tokenize(self, length, generator):
        ids = torch.empty(length, dtype=torch.int64)
        word = 0
        for i in range(length):
            word = int(torch.multinomial(self.transition[word], 1, generator=generator))
            ids[i] = word
        return ids


class RNNModel(nn.Module):
    """Container module with an encoder, a recurrent module, and a decoder."""

    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5, tie_weights=False):
        super(RNNModel, self).__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        if tie_weights:
            if nhid != ninp:
                raise ValueError("When using the tied flag, nhid must be equal to emsize")
            self.decoder.weight = self.encoder.weight
        self.init_weights()
        self.rnn_type = rnn_type
        self.nhid = nhid
        self.nlayers = nlayers

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output)
        decoded = decoded.view(-1, self.ntoken)
        return nn.functional.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        if self.rnn_type == "LSTM":
            return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                    weight.new_zeros(self.nlayers, bsz, self.nhid))
        return weight.new_zeros(self.nlayers, bsz, self.nhid)


def batchify(data, bsz):
    # Work out how cleanly we can divide the dataset into bsz parts, trim off the
    # remainder, and lay the stream out as columns.
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous()


def repackage_hidden(h):
    """Wraps hidden states in new Tensors, to detach them from their history."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def get_batch(source, i, bptt):
    seq_len = min(bptt, len(source) - 1 - i)
    data = source[i:i + seq_len]
    target = source[i + 1:i + 1 + seq_len].view(-1)
    return data, target


parser = argparse.ArgumentParser(description="PyTorch word-level LSTM language model (synthetic corpus)")
parser.add_argument("--steps", type=int, default=60, help="total number of training batches (SGD updates)")
parser.add_argument("--seed", type=int, default=1111, help="random seed")
parser.add_argument("--model", type=str, default="LSTM", help="type of recurrent net (RNN_TANH, RNN_RELU, LSTM, GRU)")
parser.add_argument("--emsize", type=int, default=32, help="size of word embeddings")
parser.add_argument("--nhid", type=int, default=32, help="number of hidden units per layer")
parser.add_argument("--nlayers", type=int, default=2, help="number of layers")
parser.add_argument("--lr", type=float, default=20, help="initial learning rate")
parser.add_argument("--clip", type=float, default=0.25, help="gradient clipping")
parser.add_argument("--batch_size", type=int, default=10, metavar="N", help="batch size")
parser.add_argument("--bptt", type=int, default=20, help="sequence length")
parser.add_argument("--dropout", type=float, default=0.2, help="dropout applied to layers (0 = no dropout)")
parser.add_argument("--tied", action="store_true", help="tie the word embedding and softmax weights")
parser.add_argument("--epoch_batches", type=int, default=4, help="batches per pseudo-epoch before validation")
parser.add_argument("--log-interval", type=int, default=2, metavar="N", help="report interval")
args = parser.parse_args()

torch.manual_seed(args.seed)
device = torch.device("cpu")

corpus = Corpus(40, torch.Generator().manual_seed(args.seed))
eval_batch_size = 10
train_data = batchify(corpus.train, args.batch_size)
val_data = batchify(corpus.valid, eval_batch_size)
test_data = batchify(corpus.test, eval_batch_size)

ntokens = len(corpus.dictionary)
model = RNNModel(args.model, ntokens, args.emsize, args.nhid, args.nlayers, args.dropout, args.tied).to(device)
criterion = nn.NLLLoss()

save_dir = tempfile.mkdtemp(prefix="word_lm_")
save_path = os.path.join(save_dir, "model.pt")


def evaluate(data_source):
    # Turn on evaluation mode which disables dropout.
    model.eval()
    total_loss = 0.
    hidden = model.init_hidden(eval_batch_size)
    with torch.no_grad():
        for i in range(0, data_source.size(0) - 1, args.bptt):
            data, targets = get_batch(data_source, i, args.bptt)
            output, hidden = model(data, hidden)
            hidden = repackage_hidden(hidden)
            total_loss += len(data) * criterion(output, targets).item()
    return total_loss / (len(data_source) - 1)


steps_done = 0


def train():
    global steps_done
    # Turn on training mode which enables dropout.
    model.train()
    total_loss = 0.
    start_time = time.time()
    hidden = model.init_hidden(args.batch_size)
    for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
        if batch >= args.epoch_batches or steps_done >= args.steps:
            break
        data, targets = get_batch(train_data, i, args.bptt)
        # Starting each batch, we detach the hidden state from how it was previously produced.
        # If we didn't, the model would try backpropagating all the way to start of the dataset.
        model.zero_grad()
        hidden = repackage_hidden(hidden)
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()

        # `clip_grad_norm` helps prevent the exploding gradient problem in RNNs / LSTMs.
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)

        steps_done += 1
        total_loss += loss.item()
        if batch % args.log_interval == 0 and batch > 0:
            cur_loss = total_loss / args.log_interval
            elapsed = time.time() - start_time
            print("| epoch {:3d} | {:5d} batches | lr {:02.2f} | ms/batch {:5.2f} | loss {:5.2f} | ppl {:8.2f}".format(
                epoch, batch, lr, elapsed * 1000 / args.log_interval, cur_loss, math.exp(cur_loss)))
            total_loss = 0
            start_time = time.time()


# Loop over epochs.
lr = args.lr
best_val_loss = None
epoch = 0
while steps_done < args.steps:
    epoch += 1
    epoch_start_time = time.time()
    train()
    val_loss = evaluate(val_data)
    print("-" * 89)
    print("| end of epoch {:3d} | time: {:5.2f}s | valid loss {:5.2f} | valid ppl {:8.2f}".format(
        epoch, (time.time() - epoch_start_time), val_loss, math.exp(val_loss)))
    print("-" * 89)
    # Save the model if the validation loss is the best we've seen so far.
    if not best_val_loss or val_loss < best_val_loss:
        with open(save_path, "wb") as f:
            torch.save(model, f)
        best_val_loss = val_loss
    else:
        # Anneal the learning rate if no improvement has been seen in the validation dataset.
        lr /= 4.0

# Load the best saved model.
with open(save_path, "rb") as f:
    model = torch.load(f, weights_only=False)
    # after load the rnn params are not a continuous chunk of memory
    # this makes them a continuous chunk, and will speed up forward pass
    model.rnn.flatten_parameters()

# Run on test data.
test_loss = evaluate(test_data)
print("=" * 89)
print("| End of training | test loss {:5.2f} | test ppl {:8.2f}".format(test_loss, math.exp(test_loss)))
print("=" * 89)

shutil.rmtree(save_dir, ignore_errors=True)
