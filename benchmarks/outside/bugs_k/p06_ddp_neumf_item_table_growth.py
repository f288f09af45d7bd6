"""Distributed (2 gloo ranks) implicit-feedback recommender whose item catalogue grows mid-training.

NeuMF-style model: user/item embeddings, a GMF term and an MLP over [u, i, u*i]; an optional
genre tower is used only for batches from the "content" stream (every third step), so the model is
wrapped with ``DistributedDataParallel(find_unused_parameters=True)``.  Each rank trains on its
own shard of the interaction log with its own negative sampler.  At step 12 a batch of new items
is launched: the item table is enlarged by building a bigger ``nn.Parameter`` (old rows copied,
new rows drawn from a generator seeded identically on every rank), the optimizer is rebuilt, and
interactions with the new items start to arrive.

Modelled on: pytorch/pytorch#12603 "DistributedDataParallel does not get the same grad at all":
the reporter assigned a new parameter after the DDP constructor; teng-li explains that DDP
registers its gradient-reduction hooks on the parameters it sees at construction time, so "if you
change the parameter yourself to a new one after wrapping up your model to DDP ... the new
parameter's hook won't get called" and its gradients are never all-reduced.  The fix is to
(re)construct DDP after changing the parameters.

Unusual about the loop: parameter replacement during training, optimizer rebuilt in both
variants, unused-parameter detection on.  Buggy: the item table silently trains rank-locally and
the replicas drift apart; ``--healthy`` re-wraps the model in a new DDP after growing the table.
Run: python -m torch.distributed.run --standalone --nproc-per-node 2 p06_ddp_neumf_item_table_growth.py
"""
import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

torch.set_num_threads(1)
N_USERS, N_ITEMS, N_NEW, N_GENRES, DIM = 200, 300, 60, 8, 16
STEPS, GROW_AT, BATCH = 36, 12, 64


def world(seed=0):
    g = torch.Generator().manual_seed(seed)
    U = torch.randn(N_USERS, 4, generator=g)
    V = torch.randn(N_ITEMS + N_NEW, 4, generator=g)
    genre = torch.randint(0, N_GENRES, (N_ITEMS + N_NEW,), generator=g)
    return U, V, genre


def sample_batch(U, V, n_items, new_only_frac, g):
    users = torch.randint(0, N_USERS, (BATCH,), generator=g)
    cand = torch.randint(0, n_items, (BATCH, 8), generator=g)
    if new_only_frac > 0:
        k = int(BATCH * new_only_frac)
        cand[:k] = torch.randint(N_ITEMS, n_items, (k, 8), generator=g)
    scores = (U[users, None, :] * V[cand]).sum(-1)
    pos = cand.gather(1, scores.argmax(1, keepdim=True)).squeeze(1)
    neg = torch.randint(0, n_items, (BATCH,), generator=g)
    items = torch.cat([pos, neg])
    return users.repeat(2), items, torch.cat([torch.ones(BATCH), torch.zeros(BATCH)])


class NeuMF(nn.Module):
    def __init__(self):
        super().__init__()
        self.user_emb = nn.Embedding(N_USERS, DIM)
        self.item_emb = nn.Embedding(N_ITEMS, DIM)
        self.genre_emb = nn.Embedding(N_GENRES, DIM)
        self.mlp = nn.Sequential(nn.Linear(3 * DIM, 32), nn.ReLU(), nn.Linear(32, 1))
        for e in (self.user_emb, self.item_emb, self.genre_emb):
            nn.init.normal_(e.weight, std=0.1)

    def forward(self, users, items, genres=None):
        u, i = self.user_emb(users), self.item_emb(items)
        if genres is not None:
            i = i + self.genre_emb(genres)
        return (u * i).sum(-1) + self.mlp(torch.cat([u, i, u * i], -1)).squeeze(-1)


def grow_item_table(model, n_new, seed):
    g = torch.Generator().manual_seed(seed)            # same new rows on every rank
    old = model.item_emb.weight.data
    new_rows = torch.randn(n_new, old.size(1), generator=g) * 0.1
    model.item_emb.weight = nn.Parameter(torch.cat([old, new_rows]))
    model.item_emb.num_embeddings = old.size(0) + n_new


def max_rank_diff(t):
    t = t.detach().clone()
    hi, lo = t.clone(), t.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    return (hi - lo).abs().max().item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--healthy", action="store_true")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t0 = time.time()
    torch.manual_seed(0)
    U, V, genre = world()
    model = NeuMF()
    ddp_model = DDP(model, find_unused_parameters=True)
    opt = torch.optim.Adam(ddp_model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(100 + rank)      # rank-local shard / negative sampler
    n_items = N_ITEMS
    for step in range(STEPS):
        if step == GROW_AT:
            grow_item_table(model, N_NEW, seed=7)
            n_items = N_ITEMS + N_NEW
            if args.healthy:
                ddp_model = DDP(model, find_unused_parameters=True)   # hooks on the new parameter
            opt = torch.optim.Adam(ddp_model.parameters(), lr=1e-2)
            if rank == 0:
                print(f"step {step}: catalogue grew to {n_items} items", flush=True)
                if not args.healthy:
                    print(f"ONSET step {step}", flush=True)
        users, items, y = sample_batch(U, V, n_items, 0.5 if step >= GROW_AT else 0.0, g)
        genres = genre[items] if step % 3 == 2 else None
        loss = F.binary_cross_entropy_with_logits(ddp_model(users, items, genres), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and (step % 6 == 0 or step == STEPS - 1):
            print(f"step {step:3d} loss {loss.item():.4f}", flush=True)

    d_item = max_rank_diff(model.item_emb.weight)
    d_mlp = max_rank_diff(model.mlp[0].weight)
    d_user = max_rank_diff(model.user_emb.weight)
    if rank == 0:
        print(f"EVIDENCE max|rank0-rank1|: item_emb {d_item:.6f}, user_emb {d_user:.6f}, "
              f"mlp.0.weight {d_mlp:.6f}")
        print(f"done in {time.time() - t0:.1f}s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
