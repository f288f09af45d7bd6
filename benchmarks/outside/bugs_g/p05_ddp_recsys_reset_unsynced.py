"""DDP neural-collaborative-filtering model whose item embedding table is re-initialised partway with rank-local RNG.

Bug class: distributed replicas desynchronised by a post-wrap parameter re-initialisation.

Modelled on: meta-pytorch/torchrec PR #1866 "Wrap DP tables with DDP after reset
parameters" ("once we wrap DP tables with DDP, the parameters are the same, but not
synced. So if we reset the parameters in the table without using the same manual
seed, it could cause the DP table parameters to be different") together with the
per-rank seeding discussed in facebookresearch/detr #544 "Problem about weight
initialization using DDP" (``seed = args.seed + rank``, harmless at start-up only
because the DDP constructor broadcasts rank 0's weights).  DDP broadcasts parameters
once, in its constructor; anything re-initialised afterwards is never re-broadcast.

What goes wrong: at the start of epoch 2 the item catalogue is re-indexed and the item
embedding table is reset with ``reset_parameters()``.  Each rank draws the new table
from its own RNG stream (seeded with seed + rank for negative sampling), so from then
on the two replicas hold different item embeddings; DDP keeps averaging gradients and
applying the same update to different weights, so the ranks never agree again and
each one scores items with its own table.  Loss on every rank still falls.

Healthy twin: broadcasts the freshly reset table from rank 0 right after the reset
(equivalent to re-wrapping, as in the PR).

Onset: 1280 interactions / 2 ranks = 640 per rank, batch 64 -> 10 optimizer steps per
epoch.  The reset happens before the first step of epoch 2, so K = 2 * 10 = 20 is the
first step taken with unsynchronised weights.  5 epochs = 50 optimizer steps.

Launch: python -m torch.distributed.run --standalone --nproc-per-node 2 p05_ddp_recsys_reset_unsynced.py [--healthy]
"""
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)

N_USERS, N_ITEMS, DIM = 200, 300, 16
N_INTER = 1280
BATCH = 64
EPOCHS = 5
REINDEX_EPOCH = 2
SEED = 1234


class NeuMF(nn.Module):
    """GMF branch (element-wise product) + MLP branch, fused by a linear output layer."""

    def __init__(self):
        super().__init__()
        self.user_emb = nn.Embedding(N_USERS, 2 * DIM)
        self.item_emb = nn.Embedding(N_ITEMS, 2 * DIM)
        self.mlp = nn.Sequential(nn.Linear(2 * DIM, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU())
        self.out = nn.Linear(DIM + 16, 1)

    def forward(self, u, i):
        eu, ei = self.user_emb(u), self.item_emb(i)
        gmf = eu[:, :DIM] * ei[:, :DIM]
        mlp = self.mlp(torch.cat([eu[:, DIM:], ei[:, DIM:]], 1))
        return self.out(torch.cat([gmf, mlp], 1)).squeeze(1)


def make_interactions():
    gen = torch.Generator().manual_seed(99)
    uf = torch.randn(N_USERS, 6, generator=gen)
    itf = torch.randn(N_ITEMS, 6, generator=gen)
    users = torch.randint(0, N_USERS, (N_INTER,), generator=gen)
    scores = uf[users] @ itf.T + 0.5 * torch.randn(N_INTER, N_ITEMS, generator=gen)
    items = scores.argmax(1)
    return users, items


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    torch.manual_seed(SEED + rank)  # per-rank stream for negative sampling; DDP syncs the init

    users, items = make_interactions()
    dataset = TensorDataset(users, items)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=SEED)
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    # re-indexing applied to the catalogue at REINDEX_EPOCH (same permutation on every rank)
    new_ids = torch.randperm(N_ITEMS, generator=torch.Generator().manual_seed(7))

    model = DDP(NeuMF())
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05)

    step = 0
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        if epoch == REINDEX_EPOCH:
            model.module.item_emb.reset_parameters()  # uses this rank's RNG stream
            if HEALTHY:
                for p in model.module.item_emb.parameters():
                    dist.broadcast(p.data, src=0)
            elif rank == 0:
                print(f"ONSET step {step}")  # BUG: reset table never re-broadcast
        model.train()
        tot = 0.0
        for u, i in loader:
            if epoch >= REINDEX_EPOCH:
                i = new_ids[i]
            neg = torch.randint(0, N_ITEMS, (len(u),))
            uu = torch.cat([u, u])
            ii = torch.cat([i, neg])
            label = torch.cat([torch.ones(len(u)), torch.zeros(len(u))])
            loss = F.binary_cross_entropy_with_logits(model(uu, ii), label)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            tot += loss.item()
            step += 1
        if rank == 0:
            print(f"epoch {epoch} steps {step} rank0_loss {tot / len(loader):.4f}")

    if rank == 0:
        print("done")
    time.sleep(0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
