"""An ImageNet-style convnet classifier whose run is preempted twice and resumed mid-epoch from its checkpoint.

Modelled on: pytorch/examples imagenet/main.py
(https://github.com/pytorch/examples/blob/main/imagenet/main.py)
Habits reproduced: model, ``CrossEntropyLoss``, SGD with momentum and weight decay and a ``StepLR``
stepped once per epoch all built at start-up; ``train()`` in ``model.train()`` with
``optimizer.zero_grad()``/``loss.backward()``/``optimizer.step()``; ``validate()`` after every epoch in
``model.eval()`` under ``torch.no_grad()`` with ``is_best``/``best_acc1`` tracking; ``save_checkpoint`` of
``{'epoch', 'arch', 'state_dict', 'best_acc1', 'optimizer', 'scheduler'}`` (plus the step counter and batch
index, since the preemption falls mid-epoch) with a ``shutil.copyfile`` to ``model_best.pth.tar``; and the
``--resume`` branch after each preemption: everything rebuilt as at start-up, then
``model.load_state_dict(checkpoint['state_dict'])``, ``optimizer.load_state_dict(checkpoint['optimizer'])``,
``scheduler.load_state_dict(checkpoint['scheduler'])``, the shuffle reseeded per epoch (the
``train_sampler.set_epoch(epoch)`` habit) and the batches already consumed in that epoch skipped.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

import torch
import torch.nn as nn
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, Sampler, TensorDataset


class SmallConvNet(nn.Module):
    """Stands in for torchvision's ResNet: conv/BatchNorm/ReLU stages, global pooling, a linear classifier."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
        )
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.features(x), 1))


class EpochShuffleSampler(Sampler):
    """A random order that depends only on (seed, epoch), like DistributedSampler with ``set_epoch``."""

    def __init__(self, num_samples, seed):
        self.num_samples, self.seed, self.epoch = num_samples, seed, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.num_samples

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.num_samples, generator=generator).tolist())


def synthetic_images(n, seed):
    generator = torch.Generator().manual_seed(seed)
    templates = torch.randn(10, 3, 16, 16, generator=torch.Generator().manual_seed(1234))
    target = torch.randint(0, 10, (n,), generator=generator)
    images = templates[target] + 1.5 * torch.randn(n, 3, 16, 16, generator=generator)
    return TensorDataset(images, target)


def resume_points(total_steps):
    """Steps after which the job is preempted and restarted from its checkpoint."""
    k = total_steps // 3
    return [k, 2 * k] if k else []


def build(args):
    model = SmallConvNet(num_classes=10)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    scheduler = StepLR(optimizer, step_size=args.lr_step, gamma=0.1)
    return model, criterion, optimizer, scheduler


def train(train_loader, model, criterion, optimizer, start_batch, step, stop_step):
    """Runs the rest of one epoch; returns the step counter and the index of the next unconsumed batch."""
    model.train()
    for i, (images, target) in enumerate(train_loader):
        if i < start_batch:
            continue  # consumed before the preemption
        if step >= stop_step:
            return step, i
        output = model(images)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
    return step, len(train_loader)


def validate(val_loader, model, criterion):
    model.eval()
    correct, loss_sum, count = 0.0, 0.0, 0
    with torch.no_grad():
        for images, target in val_loader:
            output = model(images)
            loss_sum += criterion(output, target).item() * images.size(0)
            correct += (output.argmax(1) == target).sum().item()
            count += images.size(0)
    return 100.0 * correct / count, loss_sum / count


def checkpoint_state(args, epoch, batch_idx, step, model, best_acc1, optimizer, scheduler):
    return {"epoch": epoch, "batch_idx": batch_idx, "step": step, "arch": args.arch,
            "state_dict": model.state_dict(), "best_acc1": best_acc1,
            "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}


def save_checkpoint(state, is_best, ckpt_dir):
    filename = os.path.join(ckpt_dir, "checkpoint.pth.tar")
    torch.save(state, filename)
    if is_best:
        shutil.copyfile(filename, os.path.join(ckpt_dir, "model_best.pth.tar"))
    return filename


def main():
    parser = argparse.ArgumentParser(description="ImageNet-style training with preemption and --resume")
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps in total, across the resumes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--arch", default="smallconvnet")
    parser.add_argument("-b", "--batch-size", type=int, default=16)
    parser.add_argument("--batches-per-epoch", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--wd", "--weight-decay", type=float, default=1e-4, dest="weight_decay")
    parser.add_argument("--lr-step", type=int, default=2, help="epochs between 10x decays")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    train_dataset = synthetic_images(args.batch_size * args.batches_per_epoch, args.seed)
    val_loader = DataLoader(synthetic_images(64, args.seed + 1), batch_size=64)
    train_sampler = EpochShuffleSampler(len(train_dataset), args.seed)
    train_loader = DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler, drop_last=True)

    with tempfile.TemporaryDirectory() as ckpt_dir:
        resume = None
        for stop_step in resume_points(args.steps) + [args.steps]:
            # A restarted job: fresh objects exactly as at start-up, then the --resume branch.
            model, criterion, optimizer, scheduler = build(args)
            epoch, batch_idx, step, best_acc1 = 0, 0, 0, 0.0
            if resume:
                checkpoint = torch.load(resume, map_location="cpu")
                epoch, batch_idx, step = checkpoint["epoch"], checkpoint["batch_idx"], checkpoint["step"]
                best_acc1 = checkpoint["best_acc1"]
                model.load_state_dict(checkpoint["state_dict"])
                optimizer.load_state_dict(checkpoint["optimizer"])
                scheduler.load_state_dict(checkpoint["scheduler"])
                print(f"=> loaded checkpoint (epoch {epoch}, batch {batch_idx}, step {step})")

            while step < stop_step:
                train_sampler.set_epoch(epoch)
                step, batch_idx = train(train_loader, model, criterion, optimizer, batch_idx, step, stop_step)
                if batch_idx == len(train_loader):
                    acc1, val_loss = validate(val_loader, model, criterion)
                    scheduler.step()
                    is_best = acc1 > best_acc1
                    best_acc1 = max(acc1, best_acc1)
                    epoch, batch_idx = epoch + 1, 0
                    print(f"Epoch {epoch - 1}: step {step} val loss {val_loss:.4f} Acc@1 {acc1:.2f} "
                          f"lr {scheduler.get_last_lr()[0]:.4f}")
                    state = checkpoint_state(args, epoch, batch_idx, step, model, best_acc1, optimizer, scheduler)
                    save_checkpoint(state, is_best, ckpt_dir)
            # Preempted (or done): write the mid-epoch position as well.
            state = checkpoint_state(args, epoch, batch_idx, step, model, best_acc1, optimizer, scheduler)
            resume = save_checkpoint(state, False, ckpt_dir)

    acc1, val_loss = validate(val_loader, model, criterion)
    print(f"Done: {step} steps, val loss {val_loss:.4f} Acc@1 {acc1:.2f}, best Acc@1 {best_acc1:.2f}")


if __name__ == "__main__":
    main()
