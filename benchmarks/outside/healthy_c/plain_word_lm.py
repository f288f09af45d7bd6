"""Modelled on pytorch/examples word_language_model (main.py + model.py).

RNNModel (LSTM) with tied encoder/decoder weights, truncated BPTT with
repackage_hidden(), gradient clipping, and the *manual* SGD update from the original
(`p.data.add_(p.grad, alpha=-lr)`, no torch.optim).  Validation under model.eval()/no_grad,
lr annealed by 4x when validation loss does not improve, best model saved with torch.save
and reloaded for the final test evaluation.  Corpus: synthetic token stream from a random
first-order Markov chain (so the LM has something learnable)."""
import math, time
import torch
import torch.nn as nn

torch.manual_seed(1111)

# ----------------------------------------------------------------- data
ntokens = 50
g = torch.Generator().manual_seed(0)
trans = torch.softmax(torch.randn(ntokens, ntokens, generator=g) * 3.0, dim=-1)

def make_stream(n):
    out = torch.empty(n, dtype=torch.long)
    cur = 0
    for i in range(n):
        cur = int(torch.multinomial(trans[cur], 1, generator=g))
        out[i] = cur
    return out

train_data_raw, val_data_raw, test_data_raw = make_stream(6000), make_stream(1200), make_stream(1200)

def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous()

batch_size, eval_batch_size, bptt = 20, 10, 35
train_data = batchify(train_data_raw, batch_size)
val_data = batchify(val_data_raw, eval_batch_size)
test_data = batchify(test_data_raw, eval_batch_size)

# ----------------------------------------------------------------- model
class RNNModel(nn.Module):
    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5, tie_weights=False):
        super().__init__()
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
        self.rnn_type, self.nhid, self.nlayers = rnn_type, nhid, nlayers

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output).view(-1, self.ntoken)
        return torch.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                weight.new_zeros(self.nlayers, bsz, self.nhid))

model = RNNModel("LSTM", ntokens, 64, 64, 2, dropout=0.2, tie_weights=True)
criterion = nn.NLLLoss()

def repackage_hidden(h):
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)

def get_batch(source, i):
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)

def evaluate(data_source):
    model.eval()
    total_loss = 0.
    hidden = model.init_hidden(eval_batch_size)
    with torch.no_grad():
        for i in range(0, data_source.size(0) - 1, bptt):
            data, targets = get_batch(data_source, i)
            output, hidden = model(data, hidden)
            hidden = repackage_hidden(hidden)
            total_loss += len(data) * criterion(output, targets).item()
    return total_loss / (len(data_source) - 1)

lr, clip, log_interval = 20.0, 0.25, 4
def train(epoch):
    model.train()
    total_loss = 0.
    start_time = time.time()
    hidden = model.init_hidden(batch_size)
    for batch, i in enumerate(range(0, train_data.size(0) - 1, bptt)):
        data, targets = get_batch(train_data, i)
        hidden = repackage_hidden(hidden)
        model.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        total_loss += loss.item()
        if batch % log_interval == 0 and batch > 0:
            cur_loss = total_loss / log_interval
            elapsed = time.time() - start_time
            print(f"| epoch {epoch:3d} | {batch:3d}/{len(train_data) // bptt:3d} batches | lr {lr:.2f} | "
                  f"ms/batch {elapsed * 1000 / log_interval:5.2f} | loss {cur_loss:5.2f} | ppl {math.exp(cur_loss):8.2f}")
            total_loss = 0
            start_time = time.time()

best_val_loss = None
save = "word_lm_model.pt"
for epoch in range(1, 6):           # 5 epochs x 9 batches = 45 updates
    epoch_start_time = time.time()
    train(epoch)
    val_loss = evaluate(val_data)
    print("-" * 89)
    print(f"| end of epoch {epoch:3d} | time: {time.time() - epoch_start_time:5.2f}s | valid loss {val_loss:5.2f} | "
          f"valid ppl {math.exp(val_loss):8.2f}")
    print("-" * 89)
    if not best_val_loss or val_loss < best_val_loss:
        with open(save, "wb") as f:
            torch.save(model, f)
        best_val_loss = val_loss
    else:
        lr /= 4.0

with open(save, "rb") as f:
    model = torch.load(f, weights_only=False)
    model.rnn.flatten_parameters()
test_loss = evaluate(test_data)
print("=" * 89)
print(f"| End of training | test loss {test_loss:5.2f} | test ppl {math.exp(test_loss):8.2f}")
print("=" * 89)
