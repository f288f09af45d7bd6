"""Post-local SGD with DDP on 2 gloo ranks: replicas drift apart between averagings.

Modelled on: the PyTorch "DDP Communication Hooks" documentation and the docstrings of
``torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook`` /
``torch.distributed.optim.PostLocalSGDOptimizer`` /
``torch.distributed.algorithms.model_averaging.averagers.PeriodicModelAverager``
(Lin et al., "Don't Use Large Mini-Batches, Use Local SGD", ICLR 2020): the first
``start_localSGD_iter`` steps are ordinary synchronous DDP; afterwards gradients are
*not* all-reduced any more (``post_local_gradient_allreduce=False``), every rank takes
purely local steps, and the parameters are averaged across ranks every ``period``
optimizer steps.

What is unusual about the loop (all intentional):
  * after the warm-up phase, the two replicas have different parameters for
    ``period - 1`` out of every ``period`` steps (that is the algorithm);
  * each rank uses its own dropout RNG stream (seed + rank) and its own shard of data;
  * the rank-local momentum buffers of SGD are never synchronised (PostLocalSGD only
    averages parameters);
  * a final explicit all-reduce average makes the replicas identical before rank 0
    evaluates.
"""
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (
    PostLocalSGDState,
    post_localSGD_hook,
)
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.distributed.optim import PostLocalSGDOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

torch.set_num_threads(1)

START_LOCALSGD_ITER = 20
PERIOD = 4
EPOCHS = 3
BATCH = 32


class Net(nn.Module):
    def __init__(self, d_in=20, hidden=128, n_classes=5):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_in, hidden), nn.ReLU(), nn.Dropout(0.2),
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(0.2),
            nn.Linear(hidden, n_classes),
        )

    def forward(self, x):
        return self.net(x)


def make_dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(20, 5, generator=torch.Generator().manual_seed(123))
    x = torch.randn(n, 20, generator=g)
    y = (x @ w + 0.5 * torch.randn(n, 5, generator=g)).argmax(-1)
    return TensorDataset(x, y)


@torch.no_grad()
def replica_gap(module):
    """Max abs difference between this rank's parameters and the cross-rank mean."""
    flat = torch.cat([p.detach().flatten() for p in module.parameters()])
    mean = flat.clone()
    dist.all_reduce(mean)
    mean /= dist.get_world_size()
    gap = (flat - mean).abs().max()
    dist.all_reduce(gap, op=dist.ReduceOp.MAX)
    return gap.item()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # identical init on every rank (DDP also broadcasts rank 0's)
    model = DDP(Net())
    state = PostLocalSGDState(process_group=None, subgroup=None,
                              start_localSGD_iter=START_LOCALSGD_ITER,
                              post_local_gradient_allreduce=False)
    model.register_comm_hook(state, post_localSGD_hook)

    local_optim = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    optimizer = PostLocalSGDOptimizer(
        optim=local_optim,
        averager=PeriodicModelAverager(period=PERIOD, warmup_steps=START_LOCALSGD_ITER),
    )

    train_set = make_dataset(1280, seed=1)
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size=BATCH, sampler=sampler, drop_last=True)

    torch.manual_seed(1000 + rank)  # per-rank dropout stream, on purpose
    t0 = time.time()
    step = 0
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()  # averages parameters every PERIOD steps after warm-up
            step += 1
            # the averager fires on steps START+1, START+1+PERIOD, ...
            if step in (START_LOCALSGD_ITER - 1, START_LOCALSGD_ITER + 2,
                        START_LOCALSGD_ITER + PERIOD, START_LOCALSGD_ITER + PERIOD + 1):
                gap = replica_gap(model.module)
                if rank == 0:
                    print(f"step {step:3d} loss {loss.item():.4f} replica gap {gap:.2e}")
        if rank == 0:
            print(f"epoch {epoch} done, step {step}, last loss {loss.item():.4f}")

    # make the replicas identical before evaluating / saving
    with torch.no_grad():
        for p in model.module.parameters():
            dist.all_reduce(p)
            p /= world
    gap = replica_gap(model.module)

    if rank == 0:
        test = make_dataset(1000, seed=2)
        model.module.eval()
        with torch.no_grad():
            acc = (model.module(test.tensors[0]).argmax(-1) == test.tensors[1]).float().mean()
        print(f"final gap {gap:.1e} test acc {acc.item():.3f} ({time.time() - t0:.1f}s)")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
