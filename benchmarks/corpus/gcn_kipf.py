"""Two-layer graph convolutional network for semi-supervised node classification, full batch.

Modelled on: tkipf/pygcn (https://github.com/tkipf/pygcn: pygcn/layers.py, models.py,
utils.py, train.py).
Habits reproduced: a hand-written GraphConvolution layer (Parameter weight + bias,
uniform(-stdv, stdv) reset, torch.mm then torch.spmm with a sparse normalised adjacency),
row-normalised features and adjacency built with numpy, F.dropout(x, self.dropout,
training=self.training), Adam with weight_decay, a train(epoch) function that evaluates
the validation split every epoch in model.eval() *without* torch.no_grad (as the original
does), and a final test(). A random block-structured graph stands in for Cora.
"""
from __future__ import division
from __future__ import print_function

import argparse
import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.nn.parameter import Parameter
from torch.nn.modules.module import Module


# ---------------------------------------------------------------- utils

def encode_onehot(labels):
    classes = sorted(set(labels))
    classes_dict = {c: np.identity(len(classes))[i, :] for i, c in enumerate(classes)}
    labels_onehot = np.array(list(map(classes_dict.get, labels)), dtype=np.int32)
    return labels_onehot


def normalize(mx):
    """Row-normalize a dense numpy matrix."""
    rowsum = np.array(mx.sum(1))
    r_inv = np.power(rowsum, -1.0).flatten()
    r_inv[np.isinf(r_inv)] = 0.
    return r_inv[:, None] * mx


def dense_to_torch_sparse_tensor(mx):
    """Convert a dense numpy matrix holding mostly zeros to a torch sparse tensor."""
    mx = mx.astype(np.float32)
    rows, cols = np.nonzero(mx)
    indices = torch.from_numpy(np.vstack((rows, cols)).astype(np.int64))
    values = torch.from_numpy(mx[rows, cols])
    return torch.sparse_coo_tensor(indices, values, torch.Size(mx.shape)).coalesce()


def load_data(n_nodes=240, n_feats=120, n_classes=6):
    """Sample a stochastic block model: nodes of one class link more often and share
    a class-specific bag of words, like the citation datasets."""
    print("Generating synthetic citation graph...")
    labels_raw = np.random.randint(0, n_classes, n_nodes)
    word_bias = np.random.rand(n_classes, n_feats) < 0.15
    features = ((np.random.rand(n_nodes, n_feats) < 0.03) | (word_bias[labels_raw] & (np.random.rand(n_nodes, n_feats) < 0.5)))
    features = features.astype(np.float32)
    same = labels_raw[:, None] == labels_raw[None, :]
    prob = np.where(same, 0.05, 0.004)
    edges = np.triu(np.random.rand(n_nodes, n_nodes) < prob, 1)
    adj = edges.astype(np.float32)
    # build symmetric adjacency matrix
    adj = adj + adj.T * (adj.T > adj) - adj * (adj.T > adj)

    features = normalize(features)
    adj = normalize(adj + np.eye(adj.shape[0]))

    idx_train = range(60)
    idx_val = range(60, 140)
    idx_test = range(140, n_nodes)

    features = torch.FloatTensor(features)
    labels = torch.LongTensor(np.where(encode_onehot(list(labels_raw)))[1])
    adj = dense_to_torch_sparse_tensor(adj)

    idx_train = torch.LongTensor(idx_train)
    idx_val = torch.LongTensor(idx_val)
    idx_test = torch.LongTensor(idx_test)
    return adj, features, labels, idx_train, idx_val, idx_test


def accuracy(output, labels):
    preds = output.max(1)[1].type_as(labels)
    correct = preds.eq(labels).double()
    correct = correct.sum()
    return correct / len(labels)


# ---------------------------------------------------------------- layers / models

class GraphConvolution(Module):
    """Simple GCN layer: A_hat X W + b."""

    def __init__(self, in_features, out_features, bias=True):
        super(GraphConvolution, self).__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(torch.FloatTensor(in_features, out_features))
        if bias:
            self.bias = Parameter(torch.FloatTensor(out_features))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        stdv = 1. / math.sqrt(self.weight.size(1))
        self.weight.data.uniform_(-stdv, stdv)
        if self.bias is not None:
            self.bias.data.uniform_(-stdv, stdv)

    def forward(self, input, adj):
        support = torch.mm(input, self.weight)
        output = torch.spmm(adj, support)
        if self.bias is not None:
            return output + self.bias
        return output

    def __repr__(self):
        return self.__class__.__name__ + " (" + str(self.in_features) + " -> " + str(self.out_features) + ")"


class GCN(nn.Module):
    def __init__(self, nfeat, nhid, nclass, dropout):
        super(GCN, self).__init__()
        self.gc1 = GraphConvolution(nfeat, nhid)
        self.gc2 = GraphConvolution(nhid, nclass)
        self.dropout = dropout

    def forward(self, x, adj):
        x = F.relu(self.gc1(x, adj))
        x = F.dropout(x, self.dropout, training=self.training)
        x = self.gc2(x, adj)
        return F.log_softmax(x, dim=1)


# ---------------------------------------------------------------- train

parser = argparse.ArgumentParser()
parser.add_argument("--fastmode", action="store_true", default=False, help="Validate during training pass.")
parser.add_argument("--seed", type=int, default=42, help="Random seed.")
parser.add_argument("--steps", type=int, default=200, help="Number of epochs to train (one Adam step each).")
parser.add_argument("--lr", type=float, default=0.01, help="Initial learning rate.")
parser.add_argument("--weight_decay", type=float, default=5e-4, help="Weight decay (L2 loss on parameters).")
parser.add_argument("--hidden", type=int, default=16, help="Number of hidden units.")
parser.add_argument("--dropout", type=float, default=0.5, help="Dropout rate (1 - keep probability).")
args = parser.parse_args()

np.random.seed(args.seed)
torch.manual_seed(args.seed)

# Load data
adj, features, labels, idx_train, idx_val, idx_test = load_data()

# Model and optimizer
model = GCN(nfeat=features.shape[1], nhid=args.hidden, nclass=labels.max().item() + 1, dropout=args.dropout)
optimizer = optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)


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
          "loss_train: {:.4f}".format(loss_train.item()),
          "acc_train: {:.4f}".format(acc_train.item()),
          "loss_val: {:.4f}".format(loss_val.item()),
          "acc_val: {:.4f}".format(acc_val.item()),
          "time: {:.4f}s".format(time.time() - t))


def test():
    model.eval()
    output = model(features, adj)
    loss_test = F.nll_loss(output[idx_test], labels[idx_test])
    acc_test = accuracy(output[idx_test], labels[idx_test])
    print("Test set results:",
          "loss= {:.4f}".format(loss_test.item()),
          "accuracy= {:.4f}".format(acc_test.item()))


# Train model
t_total = time.time()
for epoch in range(args.steps):
    train(epoch)
print("Optimization Finished!")
print("Total time elapsed: {:.4f}s".format(time.time() - t_total))

# Testing
test()
