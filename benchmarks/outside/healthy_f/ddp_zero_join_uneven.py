"""DDP + ZeroRedundancyOptimizer on ranks with different numbers of batches, kept in step
with the Join context manager.

Modelled on the PyTorch tutorial "Distributed Training with Uneven Inputs Using the Join
Context Manager" (torch.distributed.algorithms.join.Join wrapping both the DDP model and a
ZeroRedundancyOptimizer so that ranks that run out of data early shadow the collectives of
the others), with the ZeRO optimizer set up as in the "Shard Optimizer States with
ZeroRedundancyOptimizer" tutorial. Launch with:

    python -m torch.distributed.run --standalone --nproc-per-node 2 ddp_zero_join_uneven.py

Unusual loop: rank 0 sees more batches per epoch than rank 1 (the data is split by source,
not by a DistributedSampler), so in the last steps of each epoch rank 1 has left the loop
and only joins the all-reduces / parameter broadcasts through Join; each rank holds only
its shard of the AdamW state, and the full optimizer state is consolidated on rank 0 for a
checkpoint.
"""
import argparse
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.join import Join
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP


def shard_for_rank(rank, seed=0):
    """Each rank reads its own 'file': rank 0 has 14 batches of 32, rank 1 has 10."""
    n_batches = 14 if rank == 0 else 10
    g = torch.Generator().manual_seed(seed + rank)
    w_true = torch.randn(24, generator=torch.Generator().manual_seed(99))
    x = torch.randn(n_batches * 32, 24, generator=g)
    y = (x @ w_true + 0.5 * torch.tanh(x[:, 0] * x[:, 1]) > 0).long()
    return list(zip(x.split(32), y.split(32)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--healthy", action="store_true", help="ignored")
    ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)

    model = nn.Sequential(nn.Linear(24, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 2))
    ddp = DDP(model)
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW, lr=2e-3, weight_decay=1e-2)
    batches = shard_for_rank(rank)

    steps = 0
    for epoch in range(4):
        tot = torch.zeros(2)
        with Join([ddp, opt]):
            for x, y in batches:
                loss = F.cross_entropy(ddp(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                steps += 1
                tot += torch.tensor([loss.item() * len(y), len(y)])
        dist.all_reduce(tot)
        if rank == 0:
            print(f"epoch {epoch} mean loss {tot[0] / tot[1]:.4f}")

    # parameters must be identical on both ranks after the joined epochs
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    mismatch = (flat - ref).abs().max().item()

    opt.consolidate_state_dict(to=0)
    if rank == 0:
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "ckpt.pt")
            torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, path)
            n_state = len(torch.load(path, weights_only=False)["optim"]["state"])
        print(f"rank0 steps {steps}; optimizer state for {n_state} params consolidated")
    dist.barrier()
    print(f"rank {rank} steps {steps} max param diff vs rank0 {mismatch:.1e}")
    del ddp, opt   # drop the DDP reducer before tearing the group down
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
