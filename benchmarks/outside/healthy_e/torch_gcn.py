"""Two-layer Graph Convolutional Network, written by hand, on a synthetic citation-style graph.

Modelled on Thomas Kipf's reference PyTorch implementation ``tkipf/pygcn``
(``pygcn/train.py``, ``pygcn/layers.py``; Kipf & Welling, ICLR 2017):
a ``GraphConvolution`` layer computing ``A_hat @ (X @ W) + b`` with a sparse,
symmetrically normalised adjacency ``D^-1/2 (A + I) D^-1/2``, ReLU + dropout
between the two layers, log-softmax + NLL loss on the labelled training nodes
only, Adam (lr=0.05, weight_decay=5e-4), and full-batch training.

As in pygcn's successors (and the GCN paper's "window of 10 epochs"), training
uses early stopping on the validation loss (patience 5), keeps the best
weights in memory and restores them before the final test evaluation.  The
graph is a stochastic block model with 4 communities and noisy bag-of-words
features.  At most 80 epochs (= optimizer steps).
"""
import argparse
import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true", help="ignored")
parser.add_argument("--epochs", type=int, default=80)
parser.add_argument("--patience", type=int, default=5)
args = parser.parse_args()

torch.set_num_threads(1)
torch.manual_seed(42)

# ---------------------------------------------------------------- data
N, C, F_IN = 400, 4, 64
labels = torch.arange(N) % C
labels = labels[torch.randperm(N)]
same = labels[:, None] == labels[None, :]
prob = torch.where(same, torch.tensor(0.05), torch.tensor(0.004))
upper = torch.triu(torch.rand(N, N) < prob, diagonal=1)
adj_dense = (upper | upper.T).float()
# features: each class has a preferred set of "words", plus noise
centroids = (torch.rand(C, F_IN) < 0.15).float()
features = ((centroids[labels] * 0.3 + torch.rand(N, F_IN) * 0.7) > 0.55).float()
features = features / features.sum(1, keepdim=True).clamp(min=1)  # row-normalise, as pygcn


def normalize_adj(a):
    a = a + torch.eye(a.size(0))
    d_inv_sqrt = a.sum(1).pow(-0.5)
    d_inv_sqrt[torch.isinf(d_inv_sqrt)] = 0.0
    return (d_inv_sqrt[:, None] * a * d_inv_sqrt[None, :]).to_sparse()


adj = normalize_adj(adj_dense)
perm = torch.randperm(N)
idx_train, idx_val, idx_test = perm[:80], perm[80:200], perm[200:]


# ---------------------------------------------------------------- model
class GraphConvolution(nn.Module):
    def __init__(self, in_features, out_features, bias=True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.reset_parameters()

    def reset_parameters(self):
        stdv = 1.0 / math.sqrt(self.weight.size(1))
        self.weight.data.uniform_(-stdv, stdv)
        if self.bias is not None:
            self.bias.data.uniform_(-stdv, stdv)

    def forward(self, x, adj):
        support = torch.mm(x, self.weight)
        output = torch.sparse.mm(adj, support)
        return output + self.bias if self.bias is not None else output


class GCN(nn.Module):
    def __init__(self, nfeat, nhid, nclass, dropout):
        super().__init__()
        self.gc1 = GraphConvolution(nfeat, nhid)
        self.gc2 = GraphConvolution(nhid, nclass)
        self.dropout = dropout

    def forward(self, x, adj):
        x = F.relu(self.gc1(x, adj))
        x = F.dropout(x, self.dropout, training=self.training)
        x = self.gc2(x, adj)
        return F.log_softmax(x, dim=1)


def accuracy(output, target):
    return (output.argmax(1) == target).float().mean().item()


model = GCN(F_IN, 16, C, dropout=0.5)
optimizer = torch.optim.Adam(model.parameters(), lr=0.05, weight_decay=5e-4)

best_val, best_state, best_epoch, bad_epochs = float("inf"), None, -1, 0
for epoch in range(args.epochs):
    model.train()
    optimizer.zero_grad()
    output = model(features, adj)
    loss_train = F.nll_loss(output[idx_train], labels[idx_train])
    acc_train = accuracy(output[idx_train], labels[idx_train])
    loss_train.backward()
    optimizer.step()

    # evaluate in eval mode (deactivates dropout)
    model.eval()
    with torch.no_grad():
        output = model(features, adj)
        loss_val = F.nll_loss(output[idx_val], labels[idx_val]).item()
        acc_val = accuracy(output[idx_val], labels[idx_val])
    if epoch % 10 == 0:
        print(f"Epoch {epoch + 1:04d} loss_train {loss_train.item():.4f} acc_train {acc_train:.4f} "
              f"loss_val {loss_val:.4f} acc_val {acc_val:.4f}")

    if loss_val < best_val:
        best_val, best_epoch, bad_epochs = loss_val, epoch, 0
        best_state = copy.deepcopy(model.state_dict())
    else:
        bad_epochs += 1
        if bad_epochs >= args.patience:
            print(f"Early stopping at epoch {epoch + 1} (best epoch {best_epoch + 1})")
            break

print(f"Optimization finished; restoring best model from epoch {best_epoch + 1} (val loss {best_val:.4f})")
model.load_state_dict(best_state)
model.eval()
with torch.no_grad():
    output = model(features, adj)
    loss_test = F.nll_loss(output[idx_test], labels[idx_test])
    acc_test = accuracy(output[idx_test], labels[idx_test])
print(f"Test set results: loss= {loss_test.item():.4f} accuracy= {acc_test:.4f}")
