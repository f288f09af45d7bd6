"""Semi-supervised node classification with a 2-layer GCN plus self-training (pseudo-labels).

Kipf & Welling-style GCN on a synthetic citation-like graph (stochastic block model, 4 topics,
bag-of-words-like noisy features, only 5 labelled nodes per class).  After a 10-step warm-up the
loop switches on self-training (Li, Han & Wu, AAAI 2018 "Deeper Insights into GCNs"): every few
steps the model is put in ``eval()`` mode, predicts all nodes, and the most confident unlabelled
nodes of each class are added to the training set with their predicted labels.

Modelled on: pytorch/pytorch#26338 "Behavior of F.dropout in eval mode" -- ``F.dropout(x)`` inside
``forward`` is *not* switched off by ``model.eval()``; "it is expected that you need to manually
specify the arg ``training=...``".  tkipf/pygcn writes ``F.dropout(x, self.dropout,
training=self.training)``; dropping that argument keeps dropout active in every "eval" pass, so the
pseudo-labels are drawn from a randomly thinned network.

Unusual about the loop: full-batch training on a dense normalised adjacency; the label set grows
during training; no evaluation happens before self-training starts (so the first 10 steps are the
same in both variants).  ``--healthy`` passes ``training=self.training``.
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
N, C, D = 800, 4, 48


def make_graph(seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(N) % C
    y = y[torch.randperm(N, generator=g)]
    same = (y[:, None] == y[None, :]).float()
    prob = 0.012 * same + 0.0015 * (1 - same)
    A = (torch.rand(N, N, generator=g) < prob).float()
    A = torch.triu(A, 1)
    A = A + A.T + torch.eye(N)
    dinv = A.sum(1).rsqrt()
    A_hat = dinv[:, None] * A * dinv[None, :]
    centers = (torch.rand(C, D, generator=g) < 0.2).float()
    X = ((centers[y] + 0.75 * torch.rand(N, D, generator=g)) > 0.7).float()
    X = X / X.sum(1, keepdim=True).clamp(min=1)
    perm = torch.randperm(N, generator=g)
    train_idx = torch.cat([perm[(y[perm] == c)][:5] for c in range(C)])
    rest = perm[~torch.isin(perm, train_idx)]
    return A_hat, X, y, train_idx, rest[:100], rest[100:300]   # the other 480 nodes are unlabelled


class GCN(nn.Module):
    def __init__(self, nfeat, nhid, nclass, dropout, healthy):
        super().__init__()
        self.gc1, self.gc2 = nn.Linear(nfeat, nhid), nn.Linear(nhid, nclass)
        self.dropout, self.healthy = dropout, healthy

    def forward(self, x, adj):
        if self.healthy:
            x = F.dropout(x, self.dropout, training=self.training)
            x = F.relu(adj @ self.gc1(x))
            x = F.dropout(x, self.dropout, training=self.training)
        else:
            x = F.dropout(x, self.dropout)
            x = F.relu(adj @ self.gc1(x))
            x = F.dropout(x, self.dropout)
        return F.log_softmax(adj @ self.gc2(x), dim=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--healthy", action="store_true")
    ap.add_argument("--epochs", type=int, default=50)
    ap.add_argument("--self_train_start", type=int, default=10)
    ap.add_argument("--pseudo_every", type=int, default=5)
    ap.add_argument("--per_class", type=int, default=15)
    args = ap.parse_args()
    t0 = time.time()
    torch.manual_seed(0)
    adj, X, y, idx_train, idx_val, idx_test = make_graph()
    model = GCN(D, 32, C, dropout=0.5, healthy=args.healthy)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    labels = y.clone()                      # pseudo-labels overwrite entries outside idx_train
    labelled = idx_train.clone()
    pseudo_correct = []

    for epoch in range(args.epochs):
        if epoch >= args.self_train_start and (epoch - args.self_train_start) % args.pseudo_every == 0:
            if epoch == args.self_train_start and not args.healthy:
                print(f"ONSET step {epoch}", flush=True)
            model.eval()
            with torch.no_grad():
                prob = model(X, adj).exp()
            model.train()
            conf, pred = prob.max(1)
            unl = torch.ones(N, dtype=torch.bool)
            unl[idx_train] = False
            unl[idx_val] = False
            unl[idx_test] = False
            new = []
            for c in range(C):
                cand = torch.nonzero(unl & (pred == c)).squeeze(1)
                new.append(cand[conf[cand].argsort(descending=True)[:args.per_class]])
            new = torch.cat(new)
            labels[new] = pred[new]
            labelled = torch.unique(torch.cat([idx_train, new]))
            pseudo_correct.append((pred[new] == y[new]).float().mean().item())
            print(f"epoch {epoch:3d} | pseudo-labelled {len(new)} nodes, accuracy of pseudo-labels "
                  f"{pseudo_correct[-1]:.3f}", flush=True)
        model.train()
        opt.zero_grad()
        out = model(X, adj)
        loss = F.nll_loss(out[labelled], labels[labelled])
        loss.backward()
        opt.step()
        if epoch % 10 == 0 or epoch == args.epochs - 1:
            print(f"epoch {epoch:3d} | loss_train {loss.item():.4f} | n_labelled {len(labelled)}", flush=True)

    model.eval()
    with torch.no_grad():
        p1, p2 = model(X, adj).exp(), model(X, adj).exp()
    acc = lambda idx: (p1[idx].argmax(1) == y[idx]).float().mean().item()
    print(f"EVIDENCE two eval-mode passes differ by max |dp| = {(p1 - p2).abs().max().item():.4f}; "
          f"mean pseudo-label accuracy {sum(pseudo_correct) / len(pseudo_correct):.3f}; "
          f"val acc {acc(idx_val):.3f} test acc {acc(idx_test):.3f}")
    print(f"done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
