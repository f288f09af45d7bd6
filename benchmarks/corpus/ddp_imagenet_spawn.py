"""Distributed image-classification training launched with mp.spawn, ImageNet-example style.

Modelled on: pytorch/examples imagenet/main.py, its ``--multiprocessing-distributed``
path.  Habits reproduced: ``main()`` computes the world size and calls
``mp.spawn(main_worker, nprocs=..., args=(ngpus_per_node, args))``; ``main_worker``
derives its rank and calls ``dist.init_process_group`` with a ``tcp://`` init method;
the batch size is divided per process; a ``DistributedSampler`` with
``set_epoch(epoch)`` each epoch; ``DistributedDataParallel``; SGD with momentum and weight
decay plus ``StepLR`` stepped per epoch; ``AverageMeter``/``ProgressMeter`` bookkeeping
with top-1/top-5 ``accuracy``; ``validate()`` under ``torch.no_grad()`` whose meters are
all-reduced across ranks; ``save_checkpoint`` (with a copy to ``model_best``) only on the
first process of each node.  On CPU there are no GPUs, so ``--workers-per-node`` stands in
for ``ngpus_per_node`` and the backend is gloo.
"""

import argparse
import os
import shutil
import socket
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.data
import torch.utils.data.distributed
from torch.optim.lr_scheduler import StepLR

best_acc1 = 0
NUM_CLASSES = 10


class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + identity)


class TinyResNet(nn.Module):
    def __init__(self, num_classes=NUM_CLASSES):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True))
        self.layer1 = BasicBlock(16, 16)
        self.layer2 = BasicBlock(16, 32, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x):
        x = self.layer2(self.layer1(self.stem(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def fake_imagenet(n, seed):
    """Random 16x16 images whose class sets the mean of one colour channel and a stripe."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randint(0, NUM_CLASSES, (n,), generator=g)
    images = torch.randn(n, 3, 16, 16, generator=g)
    for c in range(NUM_CLASSES):
        images[target == c, c % 3] += 0.3 * (c // 3 + 1)
        images[target == c, :, c] += 1.0
    return torch.utils.data.TensorDataset(images, target)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description="PyTorch ImageNet-style Training (synthetic)")
    parser.add_argument("--steps", type=int, default=40, help="total training iterations per process")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("-b", "--batch-size", default=32, type=int,
                        help="total batch size over all processes of the node")
    parser.add_argument("--lr", "--learning-rate", default=0.1, type=float, dest="lr")
    parser.add_argument("--momentum", default=0.9, type=float)
    parser.add_argument("--wd", "--weight-decay", default=1e-4, type=float, dest="weight_decay")
    parser.add_argument("-p", "--print-freq", default=2, type=int)
    parser.add_argument("--workers-per-node", default=2, type=int)
    parser.add_argument("--world-size", default=1, type=int, help="number of nodes")
    parser.add_argument("--rank", default=0, type=int, help="node rank")
    parser.add_argument("--dist-url", default=None, type=str)
    parser.add_argument("--dist-backend", default="gloo", type=str)
    parser.add_argument("--checkpoint-dir", default=None, type=str)
    args = parser.parse_args()

    if args.seed is not None:
        torch.manual_seed(args.seed)
    if args.dist_url is None:
        args.dist_url = f"tcp://127.0.0.1:{free_port()}"

    ngpus_per_node = args.workers_per_node
    args.world_size = ngpus_per_node * args.world_size
    with tempfile.TemporaryDirectory() as scratch:
        if args.checkpoint_dir is None:
            args.checkpoint_dir = scratch
        mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))


def main_worker(gpu, ngpus_per_node, args):
    global best_acc1
    args.gpu = gpu
    torch.set_num_threads(1)
    args.rank = args.rank * ngpus_per_node + gpu
    dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url,
                            world_size=args.world_size, rank=args.rank)
    if args.seed is not None:
        torch.manual_seed(args.seed)  # identical initial weights on every process

    model = TinyResNet()
    args.batch_size = int(args.batch_size / ngpus_per_node)
    model = torch.nn.parallel.DistributedDataParallel(model)

    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    scheduler = StepLR(optimizer, step_size=2, gamma=0.1)

    data_seed = 0 if args.seed is None else args.seed
    train_dataset = fake_imagenet(128, data_seed)
    val_dataset = fake_imagenet(48, data_seed + 1)
    train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset, seed=data_seed)
    val_sampler = torch.utils.data.distributed.DistributedSampler(val_dataset, shuffle=False, drop_last=True)
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, shuffle=(train_sampler is None), num_workers=0,
        sampler=train_sampler)
    val_loader = torch.utils.data.DataLoader(
        val_dataset, batch_size=args.batch_size, shuffle=False, num_workers=0, sampler=val_sampler)

    iterations_left = args.steps
    epoch = 0
    while iterations_left > 0:
        train_sampler.set_epoch(epoch)
        iterations_left -= train(train_loader, model, criterion, optimizer, epoch, args, iterations_left)
        acc1 = validate(val_loader, model, criterion, args)
        scheduler.step()

        is_best = acc1 > best_acc1
        best_acc1 = max(acc1, best_acc1)
        if args.rank % ngpus_per_node == 0:
            save_checkpoint({
                "epoch": epoch + 1,
                "arch": "tinyresnet",
                "state_dict": model.state_dict(),
                "best_acc1": best_acc1,
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
            }, is_best, args.checkpoint_dir)
        epoch += 1
    dist.destroy_process_group()


def train(train_loader, model, criterion, optimizer, epoch, args, limit):
    batch_time = AverageMeter("Time", ":6.3f")
    losses = AverageMeter("Loss", ":.4e")
    top1 = AverageMeter("Acc@1", ":6.2f")
    top5 = AverageMeter("Acc@5", ":6.2f")
    progress = ProgressMeter(len(train_loader), [batch_time, losses, top1, top5], prefix=f"Epoch: [{epoch}]")

    model.train()
    end = time.time()
    done = 0
    for i, (images, target) in enumerate(train_loader):
        if done == limit:
            break
        output = model(images)
        loss = criterion(output, target)

        acc1, acc5 = accuracy(output, target, topk=(1, 5))
        losses.update(loss.item(), images.size(0))
        top1.update(acc1[0], images.size(0))
        top5.update(acc5[0], images.size(0))

        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        done += 1

        batch_time.update(time.time() - end)
        end = time.time()
        if i % args.print_freq == 0 and args.rank == 0:
            progress.display(i + 1)
    return done


def validate(val_loader, model, criterion, args):
    losses = AverageMeter("Loss", ":.4e", Summary.NONE)
    top1 = AverageMeter("Acc@1", ":6.2f", Summary.AVERAGE)
    top5 = AverageMeter("Acc@5", ":6.2f", Summary.AVERAGE)
    progress = ProgressMeter(len(val_loader), [losses, top1, top5], prefix="Test: ")

    model.eval()
    with torch.no_grad():
        for images, target in val_loader:
            output = model(images)
            loss = criterion(output, target)
            acc1, acc5 = accuracy(output, target, topk=(1, 5))
            losses.update(loss.item(), images.size(0))
            top1.update(acc1[0], images.size(0))
            top5.update(acc5[0], images.size(0))

    top1.all_reduce()
    top5.all_reduce()
    if args.rank == 0:
        progress.display_summary()
    return top1.avg


def save_checkpoint(state, is_best, directory, filename="checkpoint.pth.tar"):
    path = os.path.join(directory, filename)
    torch.save(state, path)
    if is_best:
        shutil.copyfile(path, os.path.join(directory, "model_best.pth.tar"))


class Summary:
    NONE, AVERAGE = 0, 1


class AverageMeter:
    """Computes and stores the average and current value"""

    def __init__(self, name, fmt=":f", summary_type=Summary.AVERAGE):
        self.name = name
        self.fmt = fmt
        self.summary_type = summary_type
        self.reset()

    def reset(self):
        self.val = 0
        self.avg = 0
        self.sum = 0
        self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count

    def all_reduce(self):
        total = torch.tensor([self.sum, self.count], dtype=torch.float32)
        dist.all_reduce(total, dist.ReduceOp.SUM, async_op=False)
        self.sum, self.count = total.tolist()
        self.avg = self.sum / self.count

    def __str__(self):
        fmtstr = "{name} {val" + self.fmt + "} ({avg" + self.fmt + "})"
        return fmtstr.format(**self.__dict__)

    def summary(self):
        if self.summary_type is Summary.NONE:
            return ""
        return ("{name} {avg" + self.fmt + "}").format(**self.__dict__)


class ProgressMeter:
    def __init__(self, num_batches, meters, prefix=""):
        self.batch_fmtstr = self._get_batch_fmtstr(num_batches)
        self.meters = meters
        self.prefix = prefix

    def display(self, batch):
        entries = [self.prefix + self.batch_fmtstr.format(batch)]
        entries += [str(meter) for meter in self.meters]
        print("\t".join(entries), flush=True)

    def display_summary(self):
        entries = [" *"] + [meter.summary() for meter in self.meters]
        print(" ".join(entries), flush=True)

    def _get_batch_fmtstr(self, num_batches):
        num_digits = len(str(num_batches // 1))
        fmt = "{:" + str(num_digits) + "d}"
        return "[" + fmt + "/" + fmt.format(num_batches) + "]"


def accuracy(output, target, topk=(1,)):
    """Computes the accuracy over the k top predictions for the specified values of k"""
    with torch.no_grad():
        maxk = max(topk)
        batch_size = target.size(0)
        _, pred = output.topk(maxk, 1, True, True)
        pred = pred.t()
        correct = pred.eq(target.view(1, -1).expand_as(pred))
        res = []
        for k in topk:
            correct_k = correct[:k].reshape(-1).float().sum(0, keepdim=True)
            res.append(correct_k.mul_(100.0 / batch_size))
        return res


if __name__ == "__main__":
    main()
