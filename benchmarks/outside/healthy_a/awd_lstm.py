"""Healthy: salesforce/awd-lstm-lm (main.py, model.py, weight_drop.py, embed_regularize.py, utils.py):
an LSTM language model with WeightDrop (DropConnect on weight_hh: the raw weight is re-registered as
`weight_hh_l0_raw` and `setattr(module, 'weight_hh_l0', F.dropout(raw_w, p, training))` before every forward),
embedding dropout, truncated BPTT with a random sequence length per batch and the lr rescaled by seq_len/bptt,
repackage_hidden() detaching the hidden state between batches, AR/TAR activation regularisation, clip_grad_norm_,
then the NT-ASGD switch to torch.optim.ASGD(t0=0, lambd=0.) and an evaluation that swaps in the averaged
weights (prm.data = optimizer.state[prm]['ax'].clone()) and restores them afterwards."""
import numpy as np, torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0); np.random.seed(0)
class WeightDrop(nn.Module):
    def __init__(self, module, weights, dropout=0):
        super().__init__(); self.module, self.weights, self.dropout = module, weights, dropout; self._setup()
    def _setup(self):
        for name_w in self.weights:
            w = getattr(self.module, name_w); del self.module._parameters[name_w]
            self.module.register_parameter(name_w + '_raw', nn.Parameter(w.data))
    def _setweights(self):
        for name_w in self.weights:
            raw_w = getattr(self.module, name_w + '_raw')
            w = F.dropout(raw_w, p=self.dropout, training=True) if self.training else raw_w.clone()  # clone: a bare Parameter would be re-registered (the known modern-PyTorch fix)
            setattr(self.module, name_w, w)
    def forward(self, *args):
        self._setweights(); return self.module.forward(*args)
def embedded_dropout(embed, words, dropout=0.1):
    if dropout:
        mask = embed.weight.data.new().resize_((embed.weight.size(0), 1)).bernoulli_(1 - dropout).expand_as(embed.weight) / (1 - dropout)
        masked_embed_weight = mask * embed.weight
    else:
        masked_embed_weight = embed.weight
    return F.embedding(words, masked_embed_weight)
class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp=32, nhid=64, dropout=0.2, dropoute=0.1, wdrop=0.3):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp); self.drop = nn.Dropout(dropout)
        self.rnn = WeightDrop(nn.LSTM(ninp, nhid), ['weight_hh_l0'], dropout=wdrop)
        self.proj = nn.Linear(nhid, ninp); self.decoder = nn.Linear(ninp, ntoken)
        self.decoder.weight = self.encoder.weight   # weight tying
        self.dropoute, self.nhid = dropoute, nhid
    def forward(self, input, hidden):
        emb = embedded_dropout(self.encoder, input, dropout=self.dropoute if self.training else 0)
        raw_output, hidden = self.rnn(self.drop(emb), hidden)
        output = self.drop(raw_output)
        return self.decoder(self.proj(output)), hidden, raw_output, output
    def init_hidden(self, bsz):
        w = next(self.parameters()); return (w.new_zeros(1, bsz, self.nhid), w.new_zeros(1, bsz, self.nhid))
def repackage_hidden(h):
    return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage_hidden(v) for v in h)
def batchify(data, bsz):
    nbatch = data.size(0) // bsz; return data[:nbatch * bsz].view(bsz, -1).t().contiguous()
def get_batch(source, i, seq_len):
    seq_len = min(seq_len, len(source) - 1 - i); return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].view(-1)
ntokens = 50
def corpus(n, seed):
    r = np.random.RandomState(seed); out = [0]
    while len(out) < n: out.append((out[-1] * 7 + 3 + r.randint(0, 2)) % ntokens)
    return torch.tensor(out)
train_data, val_data = batchify(corpus(4000, 1), 10), batchify(corpus(800, 2), 5)
model = RNNModel(ntokens); criterion = nn.CrossEntropyLoss()
params = list(model.parameters()); bptt, lr, alpha, beta, clip = 12, 3e-3, 2, 1, 0.25
optimizer = torch.optim.Adam(params, lr=lr, weight_decay=1.2e-6)
def evaluate(data_source, batch_size=5):
    model.eval(); total_loss = 0; hidden = model.init_hidden(batch_size)
    with torch.no_grad():
        for i in range(0, data_source.size(0) - 1, bptt):
            data, targets = get_batch(data_source, i, bptt)
            output, hidden, _, _ = model(data, hidden)
            total_loss += len(data) * criterion(output.view(-1, ntokens), targets).item()
            hidden = repackage_hidden(hidden)
    return total_loss / len(data_source)
def train_epoch(max_batches):
    model.train(); hidden = model.init_hidden(10); batch, i = 0, 0
    while i < train_data.size(0) - 1 - 1 and batch < max_batches:
        bptt_ = bptt if np.random.random() < 0.95 else bptt / 2.
        seq_len = max(5, int(np.random.normal(bptt_, 5)))
        lr2 = optimizer.param_groups[0]['lr']; optimizer.param_groups[0]['lr'] = lr2 * seq_len / bptt
        data, targets = get_batch(train_data, i, seq_len)
        hidden = repackage_hidden(hidden)
        optimizer.zero_grad()
        output, hidden, rnn_h, dropped_rnn_h = model(data, hidden)
        raw_loss = criterion(output.view(-1, ntokens), targets)
        loss = raw_loss + alpha * dropped_rnn_h.pow(2).mean() + beta * (rnn_h[1:] - rnn_h[:-1]).pow(2).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, clip)
        optimizer.step()
        optimizer.param_groups[0]['lr'] = lr2
        batch += 1; i += seq_len
    return raw_loss.item()
for epoch in range(1, 4):
    tl = train_epoch(12)
    if 't0' in optimizer.param_groups[0]:
        tmp = {}
        for prm in model.parameters():
            tmp[prm] = prm.data.clone(); prm.data = optimizer.state[prm]['ax'].clone()
        val_loss = evaluate(val_data)
        for prm in model.parameters():
            prm.data = tmp[prm].clone()
    else:
        val_loss = evaluate(val_data)
        if epoch == 2:   # NT-ASGD trigger (here: fixed epoch instead of non-monotone interval)
            print('Switching to ASGD')
            optimizer = torch.optim.ASGD(model.parameters(), lr=lr, t0=0, lambd=0., weight_decay=1.2e-6)
    print(f"epoch {epoch} train {tl:.3f} val {val_loss:.3f}")
