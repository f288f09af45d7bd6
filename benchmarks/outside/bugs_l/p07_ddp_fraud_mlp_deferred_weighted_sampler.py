"""DDP (2 gloo ranks) tabular fraud detection with deferred re-sampling (DRS, as in the
LDAM-DRW recipe). Epoch 0 uses ordinary instance sampling with a DistributedSampler.
From epoch 1 on, the loader switches to class-balanced sampling with a
``WeightedRandomSampler``, so the rare positives get more weight.

Modelled on: EPFL-VILAB/omnidata-paper-code-dump#5 "problems of WeightedRandomSampler in
multi-gpu training": "each gpu processes the same subset from the dataloader ... the
inputs to all gpu nodes are the same ... the original WeightedRandomSampler does not
apply to DistributedDataParallel". (Background: pytorch/pytorch#77154 and
Lightning-AI/pytorch-lightning#10946; the suggested fix draws the weighted indices once
and then shards them by rank, as ``DistributedSampler`` does.) The sampler generator is
seeded from ``seed + epoch`` so that runs can be reproduced. Every rank therefore draws
the *same* indices: the all-reduced gradient is the gradient of one local batch, and
half of the global batch is wasted.

What is unusual about the loop: the sampler object is replaced at an epoch boundary.
During the first epoch everything is correct. ``--healthy`` draws
``num_samples * world_size`` weighted indices with the shared generator and keeps
``indices[rank::world_size]``. Run:
python -m torch.distributed.run --standalone --nproc-per-node 2 FILE.py [--healthy]
"""
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Sampler, TensorDataset, WeightedRandomSampler

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv
SEED = 17


class DistributedWeightedSampler(Sampler):
    """Weighted draw shared by all ranks, then strided by rank (no duplicated work)."""

    def __init__(self, weights, num_samples, rank, world, seed):
        self.weights, self.num_samples, self.rank, self.world, self.seed, self.epoch = weights, num_samples, rank, world, seed, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        idx = torch.multinomial(self.weights, self.num_samples * self.world, replacement=True, generator=g)
        return iter(idx[self.rank::self.world].tolist())

    def __len__(self):
        return self.num_samples


def make_transactions(n, seed):
    g = torch.Generator().manual_seed(seed)
    y = (torch.rand(n, generator=g) < 0.08).float()
    X = torch.randn(n, 12, generator=g)
    X[:, 0] += 1.8 * y                       # amount z-score
    X[:, 3] -= 1.2 * y                       # account age
    X[:, 5] += 0.9 * y * torch.sign(X[:, 6])  # interaction
    idx = torch.arange(n)
    return TensorDataset(X, y, idx)


class FraudMLP(nn.Module):
    def __init__(self, d=12, h=64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, h), nn.BatchNorm1d(h), nn.ReLU(), nn.Dropout(0.1),
                                 nn.Linear(h, h), nn.BatchNorm1d(h), nn.ReLU(), nn.Linear(h, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


def build_loader(ds, epoch, rank, world, drs_epoch=1, bs=64):
    if epoch < drs_epoch:
        sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=SEED)
        sampler.set_epoch(epoch)
    else:
        y = ds.tensors[1]
        counts = torch.bincount(y.long(), minlength=2).float()
        weights = (1.0 / counts)[y.long()]
        num_samples = len(ds) // world
        if HEALTHY:
            sampler = DistributedWeightedSampler(weights, num_samples, rank, world, seed=SEED)
            sampler.set_epoch(epoch)
        else:
            sampler = WeightedRandomSampler(weights, num_samples, replacement=True,
                                            generator=torch.Generator().manual_seed(SEED + epoch))
    return DataLoader(ds, batch_size=bs, sampler=sampler, drop_last=True)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    train_ds, val_ds = make_transactions(2048, seed=1), make_transactions(1024, seed=2)
    model = DDP(FraudMLP())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)

    step, overlaps, seen = 0, [], []
    for epoch in range(3):
        loader = build_loader(train_ds, epoch, rank, world)
        model.train()
        epoch_ids = []
        for X, y, idx in loader:
            if not HEALTHY and rank == 0 and epoch == 1 and not overlaps:
                print(f"ONSET step {step}")
            loss = F.binary_cross_entropy_with_logits(model(X), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            both = [torch.zeros_like(idx) for _ in range(world)]
            dist.all_gather(both, idx)
            epoch_ids.append(torch.cat(both))
            if epoch >= 1:
                overlaps.append((both[0] == both[1]).float().mean().item())
            step += 1
        seen.append(torch.cat(epoch_ids).unique().numel() / torch.cat(epoch_ids).numel())
        model.eval()
        with torch.no_grad():
            X, y, _ = val_ds.tensors
            p = torch.sigmoid(model(X))
            recall = ((p > 0.5) & (y == 1)).sum().item() / max(1, (y == 1).sum().item())
            prec = ((p > 0.5) & (y == 1)).sum().item() / max(1, (p > 0.5).sum().item())
        if rank == 0:
            print(f"epoch {epoch} step {step} loss {loss.item():.4f} val recall {recall:.3f} precision {prec:.3f} "
                  f"unique/drawn {seen[-1]:.2f}")
    if rank == 0:
        print(f"EVIDENCE same_sample_same_slot_rank0_vs_rank1={sum(overlaps) / len(overlaps):.3f} "
              f"unique_fraction_of_global_batches_after_switch={sum(seen[1:]) / len(seen[1:]):.3f} val_recall={recall:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
