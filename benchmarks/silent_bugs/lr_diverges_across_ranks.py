"""Learning rate computed from rank-local progress (karpathy/nanochat pull request 857,
"Fix LR divergence across ranks in SFT": the schedule reads each rank's own dataloader
progress, which differs between ranks).

Root-cause class: per-rank hyperparameter divergence. A DDP job decays its learning rate
by "fraction of data consumed". From the onset the fraction is read from the rank's own
packed-sequence loader instead of the global step, and the two ranks pack different
numbers of samples into their fixed-size batches: each rank applies the same all-reduced
gradient with a different learning rate, and the replicas silently drift apart.

Launch: ``python -m torch.distributed.run --standalone --nproc-per-node 2 lr_diverges_across_ranks.py``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

from _common import bug_active, init_gloo, parse_args, shard_generator, shutdown_gloo

BASE_LR = 0.05
TOTAL_SAMPLES = 400


def main() -> None:
    args = parse_args(__doc__)
    rank, world = init_gloo()
    data = shard_generator(args.seed, rank)
    target = torch.randn(8, 2, generator=torch.Generator().manual_seed(args.seed))
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=BASE_LR)
    samples_seen = 0

    model.train()
    for step in range(args.steps):
        x = torch.randn(16, 8, generator=data)  # 16 packed rows; rank 1's shard has shorter samples
        samples_seen += 16 * (2 + rank)
        progress = samples_seen / TOTAL_SAMPLES if bug_active(args, step) else (step + 1) * 16 * 2 / TOTAL_SAMPLES
        for group in optimizer.param_groups:
            group["lr"] = BASE_LR * (1.0 - 0.5 * progress)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), x @ target)
        loss.backward()
        optimizer.step()
        weight = model.module[0].weight.detach().clone()
        gathered = [torch.empty_like(weight) for _ in range(world)]
        dist.all_gather(gathered, weight)
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f} replica_gap {(gathered[0] - gathered[-1]).abs().max().item():.2e}", flush=True)
    shutdown_gloo()


if __name__ == "__main__":
    main()
