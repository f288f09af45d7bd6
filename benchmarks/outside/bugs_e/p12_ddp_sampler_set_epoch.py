"""DDP training with a shuffling DistributedSampler but no ``sampler.set_epoch(epoch)``.

Bug class: distributed data sharding / per-epoch shuffling.

Modelled on: pytorch/pytorch#31771 "DistributedSampler can't shuffle the
dataset" ("each epoch samples the data in the same order") and
pytorch/pytorch#11324 "Why does DistributedDataSampler not use default RNG?";
fixed in many projects, e.g. lucidrains/DALLE-pytorch#230 "use
data_sampler.set_epoch to avoid having the same order in each epoch" and
cszn/KAIR#106 "Bug fix in dist sampler that caused same data order in each
epoch".  ``DistributedSampler`` seeds its permutation with ``seed + epoch``;
if ``set_epoch`` is never called the epoch stays 0 and every epoch replays the
exact same shard assignment and batch order on every rank.

What goes wrong: from the second epoch on, each rank sees exactly the same
batches in the same order as in epoch 0 (and always the same half of the data),
so SGD noise is no longer re-sampled -- it is a silent loss of shuffling that
tends to over-fit the fixed batch sequence.  Nothing errors, loss decreases.

Healthy twin: calls ``sampler.set_epoch(epoch)`` at the start of every epoch.

Onset: 160 samples / 2 ranks / batch 8 = 10 optimizer steps per epoch; the
first optimizer step of epoch 1 (K = 10) is the first one fed a stale ordering.

Launch: python -m torch.distributed.run --standalone --nproc-per-node 2 p12_ddp_sampler_set_epoch.py [--healthy]
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

N, D, C = 160, 16, 4
BATCH = 8
EPOCHS = 4


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    torch.manual_seed(0)  # identical initial weights on every rank

    gen = torch.Generator().manual_seed(17)
    x = torch.randn(N, D, generator=gen)
    w = torch.randn(D, C, generator=gen)
    y = (x @ w + 0.5 * torch.randn(N, C, generator=gen)).argmax(1)
    dataset = TensorDataset(x, y)

    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler)

    model = DDP(nn.Sequential(nn.Linear(D, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, C)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    step = 0
    for epoch in range(EPOCHS):
        if HEALTHY:
            sampler.set_epoch(epoch)
        elif epoch == 1 and rank == 0:
            print(f"ONSET step {step}")  # BUG: sampler.set_epoch(epoch) is never called
        model.train()
        loss_sum, n_seen = 0.0, 0
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(yb)
            n_seen += len(yb)
            step += 1
        if rank == 0:
            print(f"epoch {epoch} step {step} rank0_mean_train_loss {loss_sum / n_seen:.4f}")

    if rank == 0:
        print("done")
    # Give gloo's worker thread a moment (GIL released) to drop its last Work objects;
    # torch 2.13 can otherwise abort at interpreter exit ("terminate called without an
    # active exception") when a Work holding Python state is destroyed during finalization.
    time.sleep(0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
