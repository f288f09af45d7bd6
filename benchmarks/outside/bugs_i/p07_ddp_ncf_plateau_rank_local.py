"""Neural collaborative filtering (GMF + MLP) on implicit feedback with ReduceLROnPlateau, under DDP.

Launch: python -m torch.distributed.run --standalone --nproc-per-node 2 p07_ddp_ncf_plateau_rank_local.py

Modelled on: lucidrains/DALLE-pytorch#268 "Does (horovod + learning rate decay) work properly?"
-- each worker called ``ReduceLROnPlateau.step(loss)`` with its *own* loss, so the learning rates
of the processes were no longer synchronized; the maintainers' fix was to pass the averaged loss
(``avg_loss``) so that every process takes the same scheduler decision.

What is unusual about the loop: every rank validates on its own shard of the held-out
interactions (as a DistributedSampler would give it) and the plateau scheduler is stepped once
per epoch.  Gradients are still all-reduced by DDP, but as soon as one rank halves its learning
rate and the other does not, the replicas apply different updates and drift apart.
``--healthy`` all-reduces the validation loss before the scheduler step (the fix).
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

torch.set_num_threads(1)

N_USERS, N_ITEMS = 400, 300


def make_interactions(seed=0):
    g = torch.Generator().manual_seed(seed)
    u_f = torch.randn(N_USERS, 8, generator=g)
    i_f = torch.randn(N_ITEMS, 8, generator=g)
    affinity = u_f @ i_f.T / 8 ** 0.5
    pos = torch.nonzero(affinity > 1.0)
    pos = pos[torch.randperm(pos.shape[0], generator=g)]
    return pos, g


def sample_negatives(users, g):
    return torch.stack([users, torch.randint(0, N_ITEMS, users.shape, generator=g)], 1)


class NeuMF(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.gmf_user = nn.Embedding(N_USERS, dim)
        self.gmf_item = nn.Embedding(N_ITEMS, dim)
        self.mlp_user = nn.Embedding(N_USERS, dim)
        self.mlp_item = nn.Embedding(N_ITEMS, dim)
        self.mlp = nn.Sequential(nn.Linear(2 * dim, 32), nn.ReLU(), nn.Linear(32, dim), nn.ReLU())
        self.predict = nn.Linear(2 * dim, 1)
        for emb in (self.gmf_user, self.gmf_item, self.mlp_user, self.mlp_item):
            nn.init.normal_(emb.weight, std=0.1)

    def forward(self, pairs):
        u, i = pairs[:, 0], pairs[:, 1]
        gmf = self.gmf_user(u) * self.gmf_item(i)
        mlp = self.mlp(torch.cat([self.mlp_user(u), self.mlp_item(i)], -1))
        return self.predict(torch.cat([gmf, mlp], -1)).squeeze(-1)


def bce_on(model, pos, neg):
    pairs = torch.cat([pos, neg])
    target = torch.cat([torch.ones(pos.shape[0]), torch.zeros(neg.shape[0])])
    return F.binary_cross_entropy_with_logits(model(pairs), target)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--healthy", action="store_true")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--steps-per-epoch", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    pos, g = make_interactions()
    n_val = 1200
    val_pos, train_pos = pos[:n_val], pos[n_val:]
    val_pos = val_pos[rank::world]             # rank-local validation shard
    train_pos = train_pos[rank::world]          # rank-local training shard
    val_neg = sample_negatives(val_pos[:, 0], torch.Generator().manual_seed(50 + rank))
    g_rank = torch.Generator().manual_seed(10 + rank)

    torch.manual_seed(0)
    model = DDP(NeuMF())
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=0.5, patience=0,
                                                           threshold=1e-2)

    step, onset, disagree = 0, None, 0
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(train_pos.shape[0], generator=g_rank)
        for b in range(args.steps_per_epoch):
            batch = train_pos[order[b * args.batch_size:(b + 1) * args.batch_size]]
            loss = bce_on(model, batch, sample_negatives(batch[:, 0], g_rank))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1

        model.eval()
        with torch.no_grad():
            val_loss = bce_on(model, val_pos, val_neg)
        avg_loss = val_loss.clone()
        dist.all_reduce(avg_loss)
        avg_loss /= world
        scheduler.step(avg_loss.item() if args.healthy else val_loss.item())

        lr_local = torch.tensor([optimizer.param_groups[0]["lr"]])
        lrs = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(lrs, lr_local)
        lrs = [t.item() for t in lrs]
        if len(set(lrs)) > 1:
            disagree += 1
        if onset is None and len(set(lrs)) > 1:
            onset = step
            if rank == 0 and not args.healthy:
                print(f"ONSET step {onset}")
        if rank == 0:
            print(f"epoch {epoch} step {step} train_loss {loss.item():.4f} val_loss(rank0) "
                  f"{val_loss.item():.4f} val_loss(avg) {avg_loss.item():.4f} lr per rank {lrs}")

    flat = torch.cat([prm.detach().flatten() for prm in model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    if rank == 0:
        print(f"EVIDENCE epochs with per-rank lr disagreement {disagree}; max|param rank0 - rank1| "
              f"{(gathered[0] - gathered[1]).abs().max().item():.6f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
