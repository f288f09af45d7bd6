"""Graph classification (community-structured vs. random graphs) with a dense
GCN, size curriculum (small graphs first) and partial fine-tuning: the input
layer of a "pre-trained" encoder is frozen and only the rest is optimised,
with gradient-norm clipping.

Modelled on: PixArt-alpha/PixArt-alpha PR #160 "fix iterator for
params_to_clip" ("since the lora_layers was initialized with filter() it would
be only iterable only once, so the call accelerator.clip_grad_norm_() would
always get an empty list, so no gradient clipping would be done"), and
pytorch/pytorch#148259 "Raise a warning when clip_grad_norm_ receives an
exhausted generator".  Here ``params_to_optimize = filter(lambda p:
p.requires_grad, model.parameters())`` is consumed by the optimizer
constructor, and the same object is later passed to ``clip_grad_norm_``,
which then clips nothing.  It only matters once a batch's gradient norm
exceeds ``max_grad_norm`` -- with the size curriculum that happens when the
larger graphs arrive.  The fix is ``list(filter(...))``.

Unusual about the loop: graphs are padded to the batch's largest graph with a
node mask; symmetric normalised adjacency computed per batch; sum read-out (so
gradient scale grows with graph size); SGD with momentum and a step LR decay.
Run: python p09_gcn_curriculum_params_to_clip_filter.py [--healthy]
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)


def make_graph(n, label, g):
    if label == 1:  # two dense communities, sparse between
        comm = torch.randint(0, 2, (n,), generator=g)
        p = torch.where(comm[:, None] == comm[None, :], 0.5, 0.05)
    else:
        p = torch.full((n, n), 0.27)
    a = (torch.rand(n, n, generator=g) < p).float().triu(1)
    a = a + a.t()
    deg = a.sum(1, keepdim=True)
    x = torch.cat([deg / n, torch.ones(n, 1), torch.randn(n, 2, generator=g) * 0.1], 1)
    return a, x


def collate(graphs):
    nmax = max(a.shape[0] for a, _, _ in graphs)
    B = len(graphs)
    A = torch.zeros(B, nmax, nmax); X = torch.zeros(B, nmax, 4); M = torch.zeros(B, nmax)
    y = torch.tensor([lab for _, _, lab in graphs])
    for i, (a, x, _) in enumerate(graphs):
        n = a.shape[0]
        A[i, :n, :n] = a; X[i, :n] = x; M[i, :n] = 1
    A_hat = A + torch.diag_embed(M)
    d = A_hat.sum(-1).clamp(min=1).pow(-0.5)
    return d[:, :, None] * A_hat * d[:, None, :], X, M, y


class GCN(nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.lin_in = nn.Linear(4, hidden)
        self.convs = nn.ModuleList([nn.Linear(hidden, hidden) for _ in range(3)])
        self.head = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 2))

    def forward(self, A, X, M):
        h = F.relu(self.lin_in(X))
        for conv in self.convs:
            h = F.relu(conv(A @ h)) * M[..., None]
        return self.head(h.sum(1))  # sum read-out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--healthy", action="store_true")
    parser.add_argument("--max_grad_norm", type=float, default=1.0)
    args = parser.parse_args()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)

    # curriculum: graph size grows with the step index
    steps, bs = 40, 32
    batches = []
    for s in range(steps):
        lo = 6 + s
        batch = []
        for _ in range(bs):
            n = int(torch.randint(lo, lo + 6, (1,), generator=g))
            lab = int(torch.randint(0, 2, (1,), generator=g))
            a, x = make_graph(n, lab, g)
            batch.append((a, x, lab))
        batches.append(collate(batch))

    model = GCN()
    model.lin_in.requires_grad_(False)  # keep the pre-trained input projection
    params_to_optimize = filter(lambda p: p.requires_grad, model.parameters())
    if args.healthy:
        params_to_optimize = list(params_to_optimize)
    optimizer = torch.optim.SGD(params_to_optimize, lr=0.02, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=15, gamma=0.5)

    onset, applied_norms = None, []
    for step, (A, X, M, y) in enumerate(batches):
        model.train()
        loss = F.cross_entropy(model(A, X, M), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        trainable = [p for p in model.parameters() if p.grad is not None]
        pre_clip = torch.norm(torch.stack([p.grad.norm() for p in trainable])).item()
        torch.nn.utils.clip_grad_norm_(params_to_optimize, args.max_grad_norm)
        post_clip = torch.norm(torch.stack([p.grad.norm() for p in trainable])).item()
        applied_norms.append(post_clip)
        if onset is None and pre_clip > args.max_grad_norm and not args.healthy:
            onset = step
            print(f"ONSET step {step}")
        optimizer.step()
        scheduler.step()
        if step % 5 == 0:
            print(f"step {step:3d} loss {loss.item():.4f} grad-norm {pre_clip:.3f}")

    print(f"EVIDENCE max grad norm consumed by optimizer.step()={max(applied_norms):.3f} "
          f"(max_grad_norm {args.max_grad_norm}) | steps above the clip={sum(n > args.max_grad_norm + 1e-6 for n in applied_norms)}")


if __name__ == "__main__":
    main()
