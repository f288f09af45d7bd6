"""Two-layer GCN on an evolving graph whose conv layers cache the normalised adjacency.

Bug class: stale cached preprocessing (graph normalisation computed once and reused
after the input graph changed).

Modelled on: pyg-team/pytorch_geometric#3762 "indexSelectLargeIndex error in
edge_index", #619 "Error due to mismatch in batch sizes at the train and eval
time" and #1173 "Cached 3366 number of edges, but found 5000" -- in each the
maintainer's answer is that ``GCNConv(cached=True)`` may only be used on a single
graph that never changes, because the symmetric normalisation D^-1/2 (A+I) D^-1/2
is computed on the first call and reused.  (Older PyG raised on an edge-count
mismatch; the cache itself never checks the graph.)  The program is a
hand-written Kipf & Welling GCN (message passing with index_add over an
edge_index, Adam, weight decay, dropout, full-batch transductive node
classification, one optimizer step per epoch) trained on a graph snapshot that
gains its newly observed edges partway through training.

What goes wrong: the conv layers were built with ``cached=True`` (the usual
speed-up in the transductive examples).  When the second snapshot arrives and
the training loop passes the new, denser ``edge_index``, both layers silently
keep propagating over the first snapshot's normalised adjacency, so the new
edges never reach the model.  Nothing errors; loss keeps decreasing.

Healthy twin: the cache is cleared when the graph changes (``reset_cache()``),
so the new snapshot is normalised and used.

Onset: snapshot 2 is loaded at epoch SNAPSHOT_EPOCH = 15, one optimizer step per
epoch, so the first step that should have used the new graph is K = 15.
Training runs 60 epochs = 60 steps (45 buggy).
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)
torch.manual_seed(0)

N_NODES, N_CLASSES, N_FEAT = 800, 4, 32
EPOCHS, SNAPSHOT_EPOCH = 60, 15


def make_graph(gen):
    """Stochastic block model; edges get an arrival snapshot (1 or 2); weak features."""
    y = torch.randint(0, N_CLASSES, (N_NODES,), generator=gen)
    same = y[:, None] == y[None, :]
    prob = torch.where(same, torch.tensor(0.012), torch.tensor(0.003))
    upper = torch.triu(torch.rand(N_NODES, N_NODES, generator=gen) < prob, 1)
    src, dst = upper.nonzero(as_tuple=True)
    # most edges become observable only in the second snapshot
    late = torch.rand(src.numel(), generator=gen) < 0.7
    means = torch.randn(N_CLASSES, N_FEAT, generator=gen) * 0.35
    x = means[y] + torch.randn(N_NODES, N_FEAT, generator=gen)

    def undirected(mask):
        s, d = src[mask], dst[mask]
        return torch.stack([torch.cat([s, d]), torch.cat([d, s])])

    return x, y, undirected(~late), undirected(torch.ones_like(late))


def gcn_norm(edge_index, n):
    loops = torch.arange(n)
    row = torch.cat([edge_index[0], loops])
    col = torch.cat([edge_index[1], loops])
    deg = torch.zeros(n).index_add_(0, col, torch.ones(col.numel()))
    dinv = deg.pow(-0.5)
    return row, col, dinv[row] * dinv[col]


class GCNConv(nn.Module):
    def __init__(self, d_in, d_out, cached=False):
        super().__init__()
        self.lin = nn.Linear(d_in, d_out, bias=False)
        self.bias = nn.Parameter(torch.zeros(d_out))
        self.cached = cached
        self._cache = None
        nn.init.xavier_uniform_(self.lin.weight)

    def reset_cache(self):
        self._cache = None

    def forward(self, x, edge_index):
        if self.cached and self._cache is not None:
            row, col, w = self._cache
        else:
            row, col, w = gcn_norm(edge_index, x.shape[0])
            if self.cached:
                self._cache = (row, col, w)
        h = self.lin(x)
        out = torch.zeros_like(h).index_add_(0, col, h[row] * w[:, None])
        return out + self.bias


class GCN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = GCNConv(N_FEAT, 32, cached=True)
        self.conv2 = GCNConv(32, N_CLASSES, cached=True)

    def forward(self, x, edge_index):
        x = F.dropout(x, 0.5, self.training)
        x = F.relu(self.conv1(x, edge_index))
        x = F.dropout(x, 0.5, self.training)
        return self.conv2(x, edge_index)


def main():
    gen = torch.Generator().manual_seed(21)
    x, y, edges_snap1, edges_snap2 = make_graph(gen)
    perm = torch.randperm(N_NODES, generator=gen)
    train_idx, val_idx = perm[:200], perm[200:500]

    model = GCN()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)

    edge_index = edges_snap1
    for epoch in range(EPOCHS):
        if epoch == SNAPSHOT_EPOCH:
            edge_index = edges_snap2  # newly observed edges arrive
            if HEALTHY:
                for conv in (model.conv1, model.conv2):
                    conv.reset_cache()
            else:
                # BUG: cached normalisation from snapshot 1 is kept
                print(f"ONSET step {epoch}")
        model.train()
        optimizer.zero_grad()
        out = model(x, edge_index)
        loss = F.cross_entropy(out[train_idx], y[train_idx])
        loss.backward()
        optimizer.step()
        if (epoch + 1) % 15 == 0:
            model.eval()
            with torch.no_grad():
                acc = (model(x, edge_index)[val_idx].argmax(1) == y[val_idx]).float().mean().item()
            print(f"epoch {epoch + 1} edges {edge_index.shape[1]} loss {loss.item():.4f} val_acc {acc:.3f}")
    print("done")


if __name__ == "__main__":
    main()
