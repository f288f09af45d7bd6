"""Supervised GraphSAGE with sampled mean aggregation over mini-batches of nodes.

Modelled on: williamleif/graphsage-simple, graphsage/model.py, encoders.py, aggregators.py
(https://github.com/williamleif/graphsage-simple).
Habits reproduced: raw node features held in a frozen nn.Embedding (its weight replaced by an
nn.Parameter with requires_grad=False), a MeanAggregator that samples neighbour sets with
random.sample and builds a row-normalised mask matrix per batch, Encoders stacked through a
lambda over the first encoder (which registers as `base_model`), weight matrices applied as
`self.weight.mm(x.t())`, torch.optim.SGD over filter(lambda p: p.requires_grad, ...),
shuffling a Python list of training node ids each batch, per-batch timing, and a validation
forward at the end in training mode without torch.no_grad, scored by micro-F1.
"""
import argparse
import random
import time
from collections import defaultdict

import numpy as np
import torch
import torch.nn as nn
from torch.nn import init


class MeanAggregator(nn.Module):
    """Aggregates a node's embeddings using mean of neighbors' embeddings."""

    def __init__(self, features, gcn=False):
        """features -- function mapping LongTensor of node ids to FloatTensor of feature values.
        gcn --- whether to perform concatenation GraphSAGE-style, or add self-loops GCN-style"""
        super(MeanAggregator, self).__init__()
        self.features = features
        self.gcn = gcn

    def forward(self, nodes, to_neighs, num_sample=10):
        _set = set
        if num_sample is not None:
            _sample = random.sample
            samp_neighs = [_set(_sample(sorted(to_neigh), num_sample)) if len(to_neigh) >= num_sample else to_neigh
                           for to_neigh in to_neighs]
        else:
            samp_neighs = to_neighs

        if self.gcn:
            samp_neighs = [samp_neigh | set([nodes[i]]) for i, samp_neigh in enumerate(samp_neighs)]
        unique_nodes_list = list(set.union(*samp_neighs))
        unique_nodes = {n: i for i, n in enumerate(unique_nodes_list)}
        mask = torch.zeros(len(samp_neighs), len(unique_nodes))
        column_indices = [unique_nodes[n] for samp_neigh in samp_neighs for n in samp_neigh]
        row_indices = [i for i in range(len(samp_neighs)) for _ in range(len(samp_neighs[i]))]
        mask[row_indices, column_indices] = 1
        num_neigh = mask.sum(1, keepdim=True)
        mask = mask.div(num_neigh)
        embed_matrix = self.features(torch.LongTensor(unique_nodes_list))
        to_feats = mask.mm(embed_matrix)
        return to_feats


class Encoder(nn.Module):
    """Encodes a node's using 'convolutional' GraphSage approach"""

    def __init__(self, features, feature_dim, embed_dim, adj_lists, aggregator,
                 num_sample=10, base_model=None, gcn=False):
        super(Encoder, self).__init__()

        self.features = features
        self.feat_dim = feature_dim
        self.adj_lists = adj_lists
        self.aggregator = aggregator
        self.num_sample = num_sample
        if base_model is not None:
            self.base_model = base_model

        self.gcn = gcn
        self.embed_dim = embed_dim
        self.weight = nn.Parameter(torch.FloatTensor(embed_dim, self.feat_dim if self.gcn else 2 * self.feat_dim))
        init.xavier_uniform_(self.weight)

    def forward(self, nodes):
        """Generates embeddings for a batch of nodes."""
        neigh_feats = self.aggregator.forward(nodes, [self.adj_lists[int(node)] for node in nodes], self.num_sample)
        if not self.gcn:
            self_feats = self.features(torch.LongTensor(nodes))
            combined = torch.cat([self_feats, neigh_feats], dim=1)
        else:
            combined = neigh_feats
        combined = torch.relu(self.weight.mm(combined.t()))
        return combined


class SupervisedGraphSage(nn.Module):

    def __init__(self, num_classes, enc):
        super(SupervisedGraphSage, self).__init__()
        self.enc = enc
        self.xent = nn.CrossEntropyLoss()

        self.weight = nn.Parameter(torch.FloatTensor(num_classes, enc.embed_dim))
        init.xavier_uniform_(self.weight)

    def forward(self, nodes):
        embeds = self.enc(nodes)
        scores = self.weight.mm(embeds)
        return scores.t()

    def loss(self, nodes, labels):
        scores = self.forward(nodes)
        return self.xent(scores, labels.squeeze())


def load_graph(num_nodes, num_feats, num_classes):
    """A homophilous random graph with class-dependent binary features, in the
    (feat_data, labels, adj_lists) shape load_cora() returns."""
    labels = np.random.randint(0, num_classes, size=(num_nodes, 1)).astype(np.int64)
    prototypes = (np.random.rand(num_classes, num_feats) < 0.2).astype(np.float32)
    noise = (np.random.rand(num_nodes, num_feats) < 0.05).astype(np.float32)
    feat_data = np.clip(prototypes[labels[:, 0]] * (np.random.rand(num_nodes, num_feats) < 0.6) + noise, 0, 1)
    adj_lists = defaultdict(set)
    for a in range(num_nodes):
        for _ in range(3):
            same = np.flatnonzero(labels[:, 0] == labels[a, 0])
            b = int(np.random.choice(same)) if np.random.rand() < 0.8 else int(np.random.randint(num_nodes))
            if b != a:
                adj_lists[a].add(b)
                adj_lists[b].add(a)
    for a in range(num_nodes):
        if not adj_lists[a]:
            adj_lists[a].add((a + 1) % num_nodes)
            adj_lists[(a + 1) % num_nodes].add(a)
    return feat_data.astype(np.float32), labels, adj_lists


def micro_f1(y_true, y_pred):
    # for single-label multi-class prediction micro-averaged F1 equals accuracy
    return float(np.mean(y_true == y_pred))


def run(args):
    np.random.seed(args.seed)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    num_nodes, num_feats, num_classes = 400, 64, 5
    feat_data, labels, adj_lists = load_graph(num_nodes, num_feats, num_classes)
    features = nn.Embedding(num_nodes, num_feats)
    features.weight = nn.Parameter(torch.FloatTensor(feat_data), requires_grad=False)

    agg1 = MeanAggregator(features, gcn=True)
    enc1 = Encoder(features, num_feats, 32, adj_lists, agg1, gcn=True)
    agg2 = MeanAggregator(lambda nodes: enc1(nodes).t(), gcn=False)
    enc2 = Encoder(lambda nodes: enc1(nodes).t(), enc1.embed_dim, 32, adj_lists, agg2,
                   base_model=enc1, gcn=True)
    enc1.num_sample = 5
    enc2.num_sample = 5

    graphsage = SupervisedGraphSage(num_classes, enc2)
    rand_indices = np.random.permutation(num_nodes)
    test = rand_indices[:100]
    val = rand_indices[100:200]
    train = list(rand_indices[200:])

    optimizer = torch.optim.SGD(filter(lambda p: p.requires_grad, graphsage.parameters()), lr=args.lr)
    times = []
    for batch in range(args.steps):
        batch_nodes = train[:args.batch_size]
        random.shuffle(train)
        start_time = time.time()
        optimizer.zero_grad()
        loss = graphsage.loss(batch_nodes, torch.LongTensor(labels[np.array(batch_nodes)]))
        loss.backward()
        optimizer.step()
        end_time = time.time()
        times.append(end_time - start_time)
        print(batch, loss.item())

    val_output = graphsage.forward(val)
    print("Validation F1:", micro_f1(labels[val][:, 0], val_output.data.numpy().argmax(axis=1)))
    test_output = graphsage.forward(test)
    print("Test F1:", micro_f1(labels[test][:, 0], test_output.data.numpy().argmax(axis=1)))
    print("Average batch time:", np.mean(times))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="supervised GraphSAGE on a random graph")
    parser.add_argument("--steps", type=int, default=100, help="mini-batches (SGD steps)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.7)
    run(parser.parse_args())
