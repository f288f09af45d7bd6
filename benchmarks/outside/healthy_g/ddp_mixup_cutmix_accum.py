"""DDP image classification with MixUp/CutMix in the collate function, label
smoothing on soft targets, and gradient accumulation under ``no_sync``; two gloo ranks.

Modelled on pytorch/vision ``references/classification/train.py`` (its
``--mixup-alpha``/``--cutmix-alpha`` options that pick one of RandomMixUp or
RandomCutMix per batch inside the DataLoader ``collate_fn``, ``--label-smoothing``
passed to ``nn.CrossEntropyLoss``, warmup + cosine LR) combined with the
``DistributedDataParallel.no_sync()`` accumulation pattern from the PyTorch DDP
notes.  Launch with:

    python -m torch.distributed.run --standalone --nproc-per-node 2 ddp_mixup_cutmix_accum.py

Unusual about the loop: the targets are soft (probability vectors from mixing
two one-hot labels, then smoothed), the inputs are blended/pasted images, and
gradients are all-reduced only on every second micro-batch (the first runs
inside ``model.no_sync()``), so the optimizer steps every other iteration.
Clean validation accuracy is the measure of progress.  4 epochs x 24
micro-batches = 48 optimizer steps.
"""
import argparse
import math
import random

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

NUM_CLASSES = 6


def make_dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, NUM_CLASSES, (n,), generator=g)
    x = torch.randn(n, 3, 16, 16, generator=g) * 1.0
    for k in range(NUM_CLASSES):
        idx = y == k
        ch, row = k % 3, (k // 3) * 8
        x[idx, ch, row + 2:row + 6, 3:13] += 0.6
    return TensorDataset(x, y)


class MixupCutmixCollate:
    """Picks MixUp or CutMix with probability 0.5 each and mixes the batch with its roll."""

    def __init__(self, num_classes, mixup_alpha=0.2, cutmix_alpha=1.0, seed=0):
        self.num_classes = num_classes
        self.mixup = torch.distributions.Beta(mixup_alpha, mixup_alpha)
        self.cutmix = torch.distributions.Beta(cutmix_alpha, cutmix_alpha)
        self.rng = random.Random(seed)

    def __call__(self, batch):
        x = torch.stack([b[0] for b in batch])
        y = torch.stack([b[1] for b in batch])
        target = F.one_hot(y, self.num_classes).float()
        x_r, t_r = x.roll(1, 0), target.roll(1, 0)
        if self.rng.random() < 0.5:
            lam = float(self.mixup.sample())
            x = x * lam + x_r * (1 - lam)
        else:
            lam = float(self.cutmix.sample())
            h, w = x.shape[-2:]
            rh, rw = int(h * math.sqrt(1 - lam)), int(w * math.sqrt(1 - lam))
            cy, cx = self.rng.randrange(h), self.rng.randrange(w)
            y0, y1 = max(cy - rh // 2, 0), min(cy + rh // 2, h)
            x0, x1 = max(cx - rw // 2, 0), min(cx + rw // 2, w)
            x = x.clone()
            x[:, :, y0:y1, x0:x1] = x_r[:, :, y0:y1, x0:x1]
            lam = 1 - (y1 - y0) * (x1 - x0) / (h * w)
        target = target * lam + t_r * (1 - lam)
        return x, target


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 24, 3, padding=1), nn.BatchNorm2d(24), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(24, 48, 3, padding=1), nn.BatchNorm2d(48), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(48, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.classifier = nn.Sequential(nn.Dropout(0.1), nn.Linear(64, NUM_CLASSES))

    def forward(self, x):
        return self.classifier(self.features(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--healthy", action="store_true", help="ignored")
    parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    train_set, val_set = make_dataset(768, 1), make_dataset(240, 2)
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=0)
    train_loader = DataLoader(train_set, batch_size=16, sampler=sampler, drop_last=True,
                              collate_fn=MixupCutmixCollate(NUM_CLASSES, seed=rank))
    val_loader = DataLoader(val_set, batch_size=60,
                            sampler=DistributedSampler(val_set, num_replicas=world, rank=rank, shuffle=False))

    model = DDP(Net())
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5, nesterov=True)
    accum, epochs = 2, 4
    steps_per_epoch = len(train_loader) // accum
    total = epochs * steps_per_epoch
    warm = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=steps_per_epoch)
    cos = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total - steps_per_epoch)
    scheduler = torch.optim.lr_scheduler.SequentialLR(optimizer, [warm, cos], milestones=[steps_per_epoch])

    for epoch in range(epochs):
        model.train()
        sampler.set_epoch(epoch)
        run = torch.zeros(2)
        for i, (x, target) in enumerate(train_loader):
            sync_now = (i + 1) % accum == 0
            if sync_now:
                loss = criterion(model(x), target) / accum
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                scheduler.step()
            else:
                with model.no_sync():
                    loss = criterion(model(x), target) / accum
                    loss.backward()
            run += torch.tensor([loss.item() * accum, 1.0])
        dist.all_reduce(run)

        model.eval()
        stats = torch.zeros(2)
        with torch.no_grad():
            for x, y in val_loader:
                stats += torch.tensor([(model(x).argmax(1) == y).sum().item(), y.numel()], dtype=torch.float)
        dist.all_reduce(stats)
        if rank == 0:
            print(f"epoch {epoch} lr {scheduler.get_last_lr()[0]:.4f} mixed_loss {run[0] / run[1]:.4f} "
                  f"val_acc {stats[0] / stats[1]:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
