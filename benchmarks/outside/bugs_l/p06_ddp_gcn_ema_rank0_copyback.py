"""DDP (2 gloo ranks) graph classification with a dense GCN. The weights are averaged
with an EMA helper written like lucidrains/ema-pytorch (``beta``, ``update_after_step``,
``update_every``, ``update_model_with_ema_every``). Every
``update_model_with_ema_every`` updates, the EMA weights are copied back into the
online model (the "EMA restart" / switch-EMA trick).

Modelled on: lucidrains/ema-pytorch#9 "Using EMA in a DDP setup". The question was
whether to call EMA only on rank 0; the answer was "just do rank 0". A follow-up
(JohnHerry) pointed out the catch: "there is a `update_model_with_ema_every` option to
update online model with ema parameters. If just do rank 0, model copies on other
devices should not know the updated parameters". DDP broadcasts parameters only when
it is constructed. After the first copy-back, rank 0 trains from the EMA weights while
rank 1 keeps its online weights. Gradients are still all-reduced, so nothing fails,
but the replicas no longer match.

What is unusual about the loop: some parameter writes happen outside the optimizer
(the EMA copy-back under ``no_grad``), and the EMA object exists only where it is
constructed. ``--healthy`` builds and updates the EMA on every rank, so the copy-back
is identical everywhere. Run:
python -m torch.distributed.run --standalone --nproc-per-node 2 FILE.py [--healthy]
"""
import copy
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv


class EMA(nn.Module):
    def __init__(self, model, beta=0.9, update_after_step=3, update_every=1, update_model_with_ema_every=None):
        super().__init__()
        self.online_model = [model]  # not registered as a submodule
        self.ema_model = copy.deepcopy(model).requires_grad_(False)
        self.beta, self.update_after_step, self.update_every = beta, update_after_step, update_every
        self.update_model_with_ema_every = update_model_with_ema_every
        self.register_buffer("step", torch.tensor(0))

    @torch.no_grad()
    def copy_params_from_ema_to_model(self):
        for p_ema, p in zip(self.ema_model.parameters(), self.online_model[0].parameters()):
            p.copy_(p_ema)

    @torch.no_grad()
    def update(self):
        self.step += 1
        step = int(self.step)
        if step % self.update_every:
            return
        if step <= self.update_after_step:
            for p_ema, p in zip(self.ema_model.parameters(), self.online_model[0].parameters()):
                p_ema.copy_(p)
            return
        for p_ema, p in zip(self.ema_model.parameters(), self.online_model[0].parameters()):
            p_ema.lerp_(p, 1.0 - self.beta)
        if self.update_model_with_ema_every and step % self.update_model_with_ema_every == 0:
            self.copy_params_from_ema_to_model()


def make_graphs(n, nodes, seed):
    """Class 0: two dense communities; class 1: a ring with random chords."""
    g = torch.Generator().manual_seed(seed)
    A = torch.zeros(n, nodes, nodes)
    y = torch.randint(2, (n,), generator=g)
    for i in range(n):
        if y[i] == 0:
            blk = (torch.arange(nodes) < nodes // 2).float()
            p = 0.6 * (blk[:, None] == blk[None, :]).float() + 0.05
        else:
            ring = torch.zeros(nodes, nodes)
            idx = torch.arange(nodes)
            ring[idx, (idx + 1) % nodes] = 1
            p = ring + 0.04
        a = (torch.rand(nodes, nodes, generator=g) < p).float().triu(1)
        A[i] = a + a.T
    deg = A.sum(-1, keepdim=True)
    X = torch.cat([deg / 4, torch.ones(n, nodes, 1), 0.5 * torch.randn(n, nodes, 2, generator=g)], dim=-1)
    return TensorDataset(A, X, y)


class GCN(nn.Module):
    def __init__(self, d_in=4, d=32, n_cls=2):
        super().__init__()
        self.lins = nn.ModuleList([nn.Linear(d_in, d), nn.Linear(d, d), nn.Linear(d, d)])
        self.head = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, n_cls))

    def forward(self, A, X):
        A_hat = A + torch.eye(A.size(-1))
        d_inv_sqrt = A_hat.sum(-1).rsqrt()
        A_norm = d_inv_sqrt.unsqueeze(-1) * A_hat * d_inv_sqrt.unsqueeze(-2)
        h = X
        for lin in self.lins:
            h = F.relu(A_norm @ lin(h))
        return self.head(h.mean(dim=1))


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    train_ds, val_ds = make_graphs(384, 12, seed=1), make_graphs(128, 12, seed=2)
    sampler = DistributedSampler(train_ds, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train_ds, batch_size=32, sampler=sampler, drop_last=True)

    model = DDP(GCN())
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=1e-4)
    ema = None
    if HEALTHY or rank == 0:
        ema = EMA(model.module, beta=0.9, update_after_step=3, update_every=1, update_model_with_ema_every=10)

    global_step = 0
    for epoch in range(5):
        sampler.set_epoch(epoch)
        model.train()
        for A, X, y in loader:
            if not HEALTHY and rank == 0 and global_step == 10:
                print(f"ONSET step {global_step}")
            loss = F.cross_entropy(model(A, X), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if ema is not None:
                ema.update()
            global_step += 1
        if rank == 0:
            with torch.no_grad():
                A, X, y = val_ds.tensors
                acc = (ema.ema_model(A, X).argmax(1) == y).float().mean().item()
            print(f"epoch {epoch} step {global_step} loss {loss.item():.4f} ema val acc {acc:.3f}")

    flat = torch.cat([p.detach().flatten() for p in model.module.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    if rank == 0:
        diff = (gathered[0] - gathered[1]).abs().max().item()
        print(f"EVIDENCE max_abs_param_diff_rank0_vs_rank1={diff:.6f} ema_on_rank1={HEALTHY} steps={global_step}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
