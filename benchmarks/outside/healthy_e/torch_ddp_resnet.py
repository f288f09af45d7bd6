"""Distributed data-parallel training of a small ResNet on synthetic images.

Modelled on the PyTorch tutorial "Getting Started with Distributed Data
Parallel" / pytorch/examples ``distributed/ddp-tutorial-series/multigpu_torchrun.py``
(the torchrun variant with a ``Trainer`` class and snapshot saving), adapted to
CPU with the gloo backend.  Launch with:

    python -m torch.distributed.run --standalone --nproc-per-node 2 torch_ddp_resnet.py

Each rank builds the same ResNet-ish CNN (BasicBlocks with BatchNorm; DDP
broadcasts rank 0's BatchNorm buffers each forward, since SyncBatchNorm is
GPU-only), wraps it in DistributedDataParallel, reads its shard of the
data through a DistributedSampler (``set_epoch`` every epoch so the shuffles
differ), trains with SGD + momentum + a MultiStepLR schedule stepped per epoch,
and rank 0 saves a snapshot (model, optimizer and scheduler state) at the end of
every epoch.  Validation accuracy is all-reduced across ranks.  5 epochs x 10
steps = 50 optimizer steps.
"""
import argparse
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_dataset(n, seed):
    """4-class images: class k has a bright bar in quadrant k, plus noise."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    x = torch.randn(n, 3, 16, 16, generator=g) * 0.5
    for k in range(4):
        r, c = divmod(k, 2)
        idx = y == k
        x[idx, :, r * 8 + 2:r * 8 + 6, c * 8 + 1:c * 8 + 7] += 1.5
    return TensorDataset(x, y)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class SmallResNet(nn.Module):
    def __init__(self, num_classes=4):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.layer1 = BasicBlock(16, 16)
        self.layer2 = BasicBlock(16, 32, stride=2)
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x):
        x = self.layer2(self.layer1(self.stem(x)))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


class Trainer:
    def __init__(self, model, train_loader, val_loader, optimizer, scheduler, snapshot_path):
        self.rank = dist.get_rank()
        self.model = DDP(model)
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.snapshot_path = snapshot_path

    def _run_batch(self, x, y):
        self.optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def _run_epoch(self, epoch):
        self.model.train()
        self.train_loader.sampler.set_epoch(epoch)
        total = torch.zeros(2)
        for x, y in self.train_loader:
            loss = self._run_batch(x, y)
            total += torch.tensor([loss.item() * x.size(0), x.size(0)])
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return (total[0] / total[1]).item()

    @torch.no_grad()
    def _validate(self):
        self.model.eval()
        stats = torch.zeros(2)
        for x, y in self.val_loader:
            pred = self.model(x).argmax(1)
            stats += torch.tensor([(pred == y).sum().item(), y.numel()], dtype=torch.float)
        dist.all_reduce(stats, op=dist.ReduceOp.SUM)
        return (stats[0] / stats[1]).item()

    def _save_snapshot(self, epoch):
        snapshot = {
            "MODEL_STATE": self.model.module.state_dict(),
            "OPTIMIZER_STATE": self.optimizer.state_dict(),
            "SCHEDULER_STATE": self.scheduler.state_dict(),
            "EPOCHS_RUN": epoch + 1,
        }
        torch.save(snapshot, self.snapshot_path)

    def train(self, max_epochs):
        for epoch in range(max_epochs):
            train_loss = self._run_epoch(epoch)
            self.scheduler.step()
            acc = self._validate()
            if self.rank == 0:
                print(f"epoch {epoch} lr {self.scheduler.get_last_lr()[0]:.4f} "
                      f"train_loss {train_loss:.4f} val_acc {acc:.3f}")
                self._save_snapshot(epoch)
            dist.barrier()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--healthy", action="store_true", help="ignored")
    parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # identical initial weights on every rank

    train_set = make_dataset(640, seed=1)
    val_set = make_dataset(256, seed=2)
    # 640 samples / 2 ranks / batch 32 = 10 steps per epoch per rank
    train_loader = DataLoader(train_set, batch_size=32, shuffle=False,
                              sampler=DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=0))
    val_loader = DataLoader(val_set, batch_size=64, shuffle=False,
                            sampler=DistributedSampler(val_set, num_replicas=world, rank=rank, shuffle=False))

    model = SmallResNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[3, 4], gamma=0.1)

    tmpdir = tempfile.mkdtemp(prefix="ddp_snapshot_") if rank == 0 else None
    obj = [tmpdir]
    dist.broadcast_object_list(obj, src=0)
    snapshot_path = os.path.join(obj[0], "snapshot.pt")

    Trainer(model, train_loader, val_loader, optimizer, scheduler, snapshot_path).train(max_epochs=5)

    if rank == 0:
        snap = torch.load(snapshot_path, weights_only=True)
        print(f"snapshot saved after {snap['EPOCHS_RUN']} epochs")
        os.remove(snapshot_path)
        os.rmdir(obj[0])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
