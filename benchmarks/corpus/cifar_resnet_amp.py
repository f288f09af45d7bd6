"""A small CIFAR-style ResNet trained on synthetic 16x16 RGB images with bf16 autocast on the CPU.

Modelled on: kuangliu/pytorch-cifar (https://github.com/kuangliu/pytorch-cifar/blob/master/main.py)
with mixed precision added the way the PyTorch AMP recipe does it
(https://pytorch.org/tutorials/recipes/recipes/amp_recipe.html).
Habits reproduced: BasicBlock ResNet with a 1x1 shortcut, random-crop-with-padding and
horizontal-flip augmentation in the dataset, SGD with momentum, Nesterov and weight decay,
CosineAnnealingLR stepped once per epoch, ``torch.autocast(device_type="cpu",
dtype=torch.bfloat16)`` around forward and loss, ``torch.amp.GradScaler("cpu")``
scale/step/update, ``optimizer.zero_grad(set_to_none=True)``, a progress line accumulating
``loss.item()`` and ``predicted.eq(targets).sum().item()``, a ``test()`` every epoch that saves
``{'net', 'acc', 'epoch'}`` when accuracy beats the best so far, and a ``--resume`` path that
reloads that checkpoint.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.utils.data import DataLoader, Dataset


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes, planes, stride=1):
        super(BasicBlock, self).__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)

        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != self.expansion * planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, self.expansion * planes, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(self.expansion * planes),
            )

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += self.shortcut(x)
        out = F.relu(out)
        return out


class ResNet(nn.Module):
    def __init__(self, block, num_blocks, num_classes=10, width=8):
        super(ResNet, self).__init__()
        self.in_planes = width

        self.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.layer1 = self._make_layer(block, width, num_blocks[0], stride=1)
        self.layer2 = self._make_layer(block, width * 2, num_blocks[1], stride=2)
        self.linear = nn.Linear(width * 2 * block.expansion, num_classes)

    def _make_layer(self, block, planes, num_blocks, stride):
        strides = [stride] + [1] * (num_blocks - 1)
        layers = []
        for stride in strides:
            layers.append(block(self.in_planes, planes, stride))
            self.in_planes = planes * block.expansion
        return nn.Sequential(*layers)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer1(out)
        out = self.layer2(out)
        out = F.adaptive_avg_pool2d(out, 1)
        out = out.view(out.size(0), -1)
        out = self.linear(out)
        return out


def ResNetTiny():
    return ResNet(BasicBlock, [1, 1])


class SyntheticCIFAR(Dataset):
    """Class-coloured noise images; training copies are randomly cropped and flipped."""

    MEAN = torch.tensor([0.4914, 0.4822, 0.4465]).view(3, 1, 1)
    STD = torch.tensor([0.2023, 0.1994, 0.2010]).view(3, 1, 1)

    def __init__(self, n, seed, train):
        generator = torch.Generator().manual_seed(seed)
        colours = torch.rand(10, 3, 1, 1, generator=torch.Generator().manual_seed(0))
        self.targets = torch.randint(0, 10, (n,), generator=generator)
        self.data = (colours[self.targets] + 0.3 * torch.rand(n, 3, 16, 16, generator=generator)).clamp(0, 1)
        self.train = train
        self.generator = generator

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        img = self.data[index]
        if self.train:
            padded = F.pad(img, (2, 2, 2, 2))
            top, left = torch.randint(0, 5, (2,), generator=self.generator).tolist()
            img = padded[:, top:top + 16, left:left + 16]
            if torch.rand(1, generator=self.generator).item() < 0.5:
                img = img.flip(-1)
        return (img - self.MEAN) / self.STD, self.targets[index]


def main():
    parser = argparse.ArgumentParser(description="CIFAR-style ResNet training with bf16 autocast")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps in total")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", default=0.1, type=float, help="learning rate")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--epoch-steps", type=int, default=3, help="batches per epoch")
    parser.add_argument("--resume", "-r", action="store_true", help="resume from checkpoint at the end")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    best_acc = 0  # best test accuracy
    start_epoch = 0

    print("==> Preparing data..")
    trainset = SyntheticCIFAR(args.batch_size * args.epoch_steps, args.seed, train=True)
    trainloader = DataLoader(trainset, batch_size=args.batch_size, shuffle=True, num_workers=0)
    testset = SyntheticCIFAR(2 * args.batch_size, args.seed + 1, train=False)
    testloader = DataLoader(testset, batch_size=args.batch_size, shuffle=False, num_workers=0)

    print("==> Building model..")
    net = ResNetTiny()
    checkpoint_dir = tempfile.TemporaryDirectory()
    ckpt_path = os.path.join(checkpoint_dir.name, "ckpt.pth")

    criterion = nn.CrossEntropyLoss()
    optimizer = optim.SGD(net.parameters(), lr=args.lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    epochs = -(-args.steps // args.epoch_steps)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)
    scaler = torch.amp.GradScaler("cpu")

    steps_done = 0

    def train(epoch):
        nonlocal steps_done
        print("\nEpoch: %d" % epoch)
        net.train()
        train_loss = 0
        correct = 0
        total = 0
        for batch_idx, (inputs, targets) in enumerate(trainloader):
            if steps_done >= args.steps:
                break
            with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                outputs = net(inputs)
                loss = criterion(outputs, targets)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            steps_done += 1

            train_loss += loss.item()
            _, predicted = outputs.max(1)
            total += targets.size(0)
            correct += predicted.eq(targets).sum().item()
            print("%d/%d | Loss: %.3f | Acc: %.3f%% (%d/%d)" % (
                batch_idx, len(trainloader), train_loss / (batch_idx + 1), 100.0 * correct / total, correct, total))

    def test(epoch):
        nonlocal best_acc
        net.eval()
        test_loss = 0
        correct = 0
        total = 0
        with torch.no_grad():
            for batch_idx, (inputs, targets) in enumerate(testloader):
                with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                    outputs = net(inputs)
                    loss = criterion(outputs, targets)

                test_loss += loss.item()
                _, predicted = outputs.max(1)
                total += targets.size(0)
                correct += predicted.eq(targets).sum().item()
        print("test | Loss: %.3f | Acc: %.3f%% (%d/%d)" % (
            test_loss / (batch_idx + 1), 100.0 * correct / total, correct, total))

        # Save checkpoint.
        acc = 100.0 * correct / total
        if acc > best_acc:
            print("Saving..")
            state = {"net": net.state_dict(), "acc": acc, "epoch": epoch}
            torch.save(state, ckpt_path)
            best_acc = acc

    epoch = start_epoch
    while steps_done < args.steps:
        train(epoch)
        test(epoch)
        scheduler.step()
        epoch += 1

    if args.resume and os.path.exists(ckpt_path):
        print("==> Resuming from checkpoint..")
        checkpoint = torch.load(ckpt_path)
        net.load_state_dict(checkpoint["net"])
        print("best acc %.3f at epoch %d" % (checkpoint["acc"], checkpoint["epoch"]))
    checkpoint_dir.cleanup()


if __name__ == "__main__":
    main()
