"""Multi-head graph attention network for node classification, full batch, early stopping on patience.

Modelled on: Diego999/pyGAT (https://github.com/Diego999/pyGAT: layers.py, models.py, train.py).
Habits reproduced: a GraphAttentionLayer written by hand (xavier_uniform_ with gain 1.414,
attention vector split into two halves, LeakyReLU scores, -9e15 masking of non-edges with
torch.where, softmax, dropout on the attention, ELU), heads registered with add_module,
Adam with weight_decay, validation every epoch in model.eval() without no_grad, a
state_dict saved per epoch as '<epoch>.pkl' with older files deleted by glob, patience
counter, then the best epoch reloaded for compute_test(). Dense random graph instead of Cora.
"""
from __future__ import division
from __future__ import print_function

import argparse
import glob
import os
import random
import shutil
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.autograd import Variable


class GraphAttentionLayer(nn.Module):
    """Simple GAT layer, similar to https://arxiv.org/abs/1710.10903"""

    def __init__(self, in_features, out_features, dropout, alpha, concat=True):
        super(GraphAttentionLayer, self).__init__()
        self.dropout = dropout
        self.in_features = in_features
        self.out_features = out_features
        self.alpha = alpha
        self.concat = concat

        self.W = nn.Parameter(torch.empty(size=(in_features, out_features)))
        nn.init.xavier_uniform_(self.W.data, gain=1.414)
        self.a = nn.Parameter(torch.empty(size=(2 * out_features, 1)))
        nn.init.xavier_uniform_(self.a.data, gain=1.414)

        self.leakyrelu = nn.LeakyReLU(self.alpha)

    def forward(self, h, adj):
        Wh = torch.mm(h, self.W)  # h.shape: (N, in_features), Wh.shape: (N, out_features)
        e = self._prepare_attentional_mechanism_input(Wh)

        zero_vec = -9e15 * torch.ones_like(e)
        attention = torch.where(adj > 0, e, zero_vec)
        attention = F.softmax(attention, dim=1)
        attention = F.dropout(attention, self.dropout, training=self.training)
        h_prime = torch.matmul(attention, Wh)

        if self.concat:
            return F.elu(h_prime)
        else:
            return h_prime

    def _prepare_attentional_mechanism_input(self, Wh):
        # Wh1 + Wh2.T is the N x N matrix of a^T [Wh_i || Wh_j] scores
        Wh1 = torch.matmul(Wh, self.a[:self.out_features, :])
        Wh2 = torch.matmul(Wh, self.a[self.out_features:, :])
        e = Wh1 + Wh2.T
        return self.leakyrelu(e)

    def __repr__(self):
        return self.__class__.__name__ + " (" + str(self.in_features) + " -> " + str(self.out_features) + ")"


class GAT(nn.Module):
    def __init__(self, nfeat, nhid, nclass, dropout, alpha, nheads):
        """Dense version of GAT."""
        super(GAT, self).__init__()
        self.dropout = dropout

        self.attentions = [GraphAttentionLayer(nfeat, nhid, dropout=dropout, alpha=alpha, concat=True) for _ in range(nheads)]
        for i, attention in enumerate(self.attentions):
            self.add_module("attention_{}".format(i), attention)

        self.out_att = GraphAttentionLayer(nhid * nheads, nclass, dropout=dropout, alpha=alpha, concat=False)

    def forward(self, x, adj):
        x = F.dropout(x, self.dropout, training=self.training)
        x = torch.cat([att(x, adj) for att in self.attentions], dim=1)
        x = F.dropout(x, self.dropout, training=self.training)
        x = F.elu(self.out_att(x, adj))
        return F.log_softmax(x, dim=1)


def load_data(n_nodes=200, n_feats=100, n_classes=5):
    """Random citation-like graph: class-dependent words, homophilous edges, row-normalised
    features, symmetric adjacency with self loops, dense tensors."""
    labels = np.random.randint(0, n_classes, n_nodes)
    topic = np.random.rand(n_classes, n_feats) < 0.2
    features = (np.random.rand(n_nodes, n_feats) < 0.02) | (topic[labels] & (np.random.rand(n_nodes, n_feats) < 0.4))
    features = features.astype(np.float32)
    features = features / np.maximum(features.sum(1, keepdims=True), 1.0)
    link = np.where(labels[:, None] == labels[None, :], 0.06, 0.005)
    adj = np.triu(np.random.rand(n_nodes, n_nodes) < link, 1).astype(np.float32)
    adj = adj + adj.T + np.eye(n_nodes, dtype=np.float32)
    adj = adj / adj.sum(1, keepdims=True)

    idx_train = torch.LongTensor(range(50))
    idx_val = torch.LongTensor(range(50, 120))
    idx_test = torch.LongTensor(range(120, n_nodes))
    return torch.FloatTensor(adj), torch.FloatTensor(features), torch.LongTensor(labels), idx_train, idx_val, idx_test


def accuracy(output, labels):
    preds = output.max(1)[1].type_as(labels)
    correct = preds.eq(labels).double()
    correct = correct.sum()
    return correct / len(labels)


# Training settings
parser = argparse.ArgumentParser()
parser.add_argument("--fastmode", action="store_true", default=False, help="Validate during training pass.")
parser.add_argument("--seed", type=int, default=72, help="Random seed.")
parser.add_argument("--steps", type=int, default=100, help="Number of epochs to train (one step each).")
parser.add_argument("--lr", type=float, default=0.005, help="Initial learning rate.")
parser.add_argument("--weight_decay", type=float, default=5e-4, help="Weight decay (L2 loss on parameters).")
parser.add_argument("--hidden", type=int, default=8, help="Number of hidden units.")
parser.add_argument("--nb_heads", type=int, default=4, help="Number of head attentions.")
parser.add_argument("--dropout", type=float, default=0.6, help="Dropout rate (1 - keep probability).")
parser.add_argument("--alpha", type=float, default=0.2, help="Alpha for the leaky_relu.")
parser.add_argument("--patience", type=int, default=100, help="Patience")
args = parser.parse_args()

random.seed(args.seed)
np.random.seed(args.seed)
torch.manual_seed(args.seed)

# Load data
adj, features, labels, idx_train, idx_val, idx_test = load_data()

# Model and optimizer
model = GAT(nfeat=features.shape[1], nhid=args.hidden, nclass=int(labels.max()) + 1,
            dropout=args.dropout, nheads=args.nb_heads, alpha=args.alpha)
optimizer = optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)

features, adj, labels = Variable(features), Variable(adj), Variable(labels)

# checkpoints go where the original writes them (the working directory); here a scratch one
ckpt_dir = tempfile.mkdtemp(prefix="pygat_")


def train(epoch):
    t = time.time()
    model.train()
    optimizer.zero_grad()
    output = model(features, adj)
    loss_train = F.nll_loss(output[idx_train], labels[idx_train])
    acc_train = accuracy(output[idx_train], labels[idx_train])
    loss_train.backward()
    optimizer.step()

    if not args.fastmode:
        # Evaluate validation set performance separately,
        # deactivates dropout during validation run.
        model.eval()
        output = model(features, adj)

    loss_val = F.nll_loss(output[idx_val], labels[idx_val])
    acc_val = accuracy(output[idx_val], labels[idx_val])
    print("Epoch: {:04d}".format(epoch + 1),
          "loss_train: {:.4f}".format(loss_train.data.item()),
          "acc_train: {:.4f}".format(acc_train.data.item()),
          "loss_val: {:.4f}".format(loss_val.data.item()),
          "acc_val: {:.4f}".format(acc_val.data.item()),
          "time: {:.4f}s".format(time.time() - t))

    return loss_val.data.item()


def compute_test():
    model.eval()
    output = model(features, adj)
    loss_test = F.nll_loss(output[idx_test], labels[idx_test])
    acc_test = accuracy(output[idx_test], labels[idx_test])
    print("Test set results:",
          "loss= {:.4f}".format(loss_test.data.item()),
          "accuracy= {:.4f}".format(acc_test.data.item()))


def ckpt(epoch):
    return os.path.join(ckpt_dir, "{}.pkl".format(epoch))


# Train model
t_total = time.time()
loss_values = []
bad_counter = 0
best = args.steps + 1
best_epoch = 0
for epoch in range(args.steps):
    loss_values.append(train(epoch))

    torch.save(model.state_dict(), ckpt(epoch))
    if loss_values[-1] < best:
        best = loss_values[-1]
        best_epoch = epoch
        bad_counter = 0
    else:
        bad_counter += 1

    if bad_counter == args.patience:
        break

    files = glob.glob(os.path.join(ckpt_dir, "*.pkl"))
    for file in files:
        epoch_nb = int(os.path.basename(file).split(".")[0])
        if epoch_nb < best_epoch:
            os.remove(file)

files = glob.glob(os.path.join(ckpt_dir, "*.pkl"))
for file in files:
    epoch_nb = int(os.path.basename(file).split(".")[0])
    if epoch_nb > best_epoch:
        os.remove(file)

print("Optimization Finished!")
print("Total time elapsed: {:.4f}s".format(time.time() - t_total))

# Restore best model
print("Loading {}th epoch".format(best_epoch))
model.load_state_dict(torch.load(ckpt(best_epoch)))

# Testing
compute_test()
shutil.rmtree(ckpt_dir)
