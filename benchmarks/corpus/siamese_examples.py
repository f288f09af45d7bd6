"""A siamese network that tells whether two synthetic 12x12 images show the same class.

Modelled on: pytorch/examples siamese network
(https://github.com/pytorch/examples/blob/main/siamese_network/main.py)
Habits reproduced: one shared-weight backbone run on both images of a pair, features
concatenated and fed to an MLP head initialised through ``self.fc.apply(self.init_weights)``
(``xavier_uniform_`` plus ``bias.data.fill_(0.01)``), Sigmoid + BCELoss, Adadelta with a
per-epoch StepLR, a pair dataset that draws a same-class or different-class partner at random,
a ``test()`` after every epoch under ``torch.no_grad()`` thresholding at 0.5, and an optional
``--save-model`` of the state dict.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile

import torch
import torch.nn as nn
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, Dataset


class SiameseNetwork(nn.Module):
    def __init__(self):
        super(SiameseNetwork, self).__init__()
        # a small convolutional backbone stands in for the ResNet the original uses
        self.backbone = nn.Sequential(
            nn.Conv2d(1, 8, kernel_size=3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, kernel_size=3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
        )
        self.fc_in_features = 16

        self.fc = nn.Sequential(
            nn.Linear(self.fc_in_features * 2, 32),
            nn.ReLU(inplace=True),
            nn.Linear(32, 1),
        )
        self.sigmoid = nn.Sigmoid()

        self.backbone.apply(self.init_weights)
        self.fc.apply(self.init_weights)

    def init_weights(self, m):
        if isinstance(m, nn.Linear):
            torch.nn.init.xavier_uniform_(m.weight)
            m.bias.data.fill_(0.01)

    def forward_once(self, x):
        output = self.backbone(x)
        return output.view(output.size()[0], -1)

    def forward(self, input1, input2):
        output1 = self.forward_once(input1)
        output2 = self.forward_once(input2)
        output = torch.cat((output1, output2), 1)
        output = self.fc(output)
        return self.sigmoid(output)


class PairDataset(Dataset):
    """Pairs of images; the target is 1 when both come from the same class."""

    def __init__(self, n, seed, classes=4):
        generator = torch.Generator().manual_seed(seed)
        self.prototypes = torch.randn(classes, 1, 12, 12, generator=generator)
        self.targets = torch.randint(0, classes, (n,), generator=generator)
        self.data = self.prototypes[self.targets] + 0.5 * torch.randn(n, 1, 12, 12, generator=generator)
        self.rng = random.Random(seed)
        self.group_examples()

    def group_examples(self):
        self.grouped_examples = {}
        for i in range(len(self.prototypes)):
            self.grouped_examples[i] = (self.targets == i).nonzero().flatten().tolist()

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        class_1 = int(self.targets[index])
        image_1 = self.data[index]
        if index % 2 == 0:
            index_2 = self.rng.choice(self.grouped_examples[class_1])
            target = torch.tensor(1, dtype=torch.float)
        else:
            others = [c for c in self.grouped_examples if c != class_1 and self.grouped_examples[c]]
            class_2 = self.rng.choice(others)
            index_2 = self.rng.choice(self.grouped_examples[class_2])
            target = torch.tensor(0, dtype=torch.float)
        return image_1, self.data[index_2], target


def train(args, model, train_loader, optimizer, epoch, state):
    model.train()
    criterion = nn.BCELoss()
    for batch_idx, (images_1, images_2, targets) in enumerate(train_loader):
        if state["steps"] >= args.steps:
            return
        optimizer.zero_grad()
        outputs = model(images_1, images_2).squeeze()
        loss = criterion(outputs, targets)
        loss.backward()
        optimizer.step()
        state["steps"] += 1
        if batch_idx % args.log_interval == 0:
            print("Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}".format(
                epoch, batch_idx * len(images_1), len(train_loader.dataset),
                100.0 * batch_idx / len(train_loader), loss.item()))


def test(model, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    criterion = nn.BCELoss()
    with torch.no_grad():
        for (images_1, images_2, targets) in test_loader:
            outputs = model(images_1, images_2).squeeze()
            test_loss += criterion(outputs, targets).sum().item()
            pred = torch.where(outputs > 0.5, 1, 0)
            correct += pred.eq(targets.view_as(pred)).sum().item()
    test_loss /= len(test_loader.dataset)
    print("\nTest set: Average loss: {:.4f}, Accuracy: {}/{} ({:.0f}%)\n".format(
        test_loss, correct, len(test_loader.dataset), 100.0 * correct / len(test_loader.dataset)))


def main():
    parser = argparse.ArgumentParser(description="Siamese network on synthetic image pairs")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps in total")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--test-batch-size", type=int, default=32)
    parser.add_argument("--epoch-steps", type=int, default=4, help="batches per epoch")
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--log-interval", type=int, default=2)
    parser.add_argument("--save-model", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    train_dataset = PairDataset(args.batch_size * args.epoch_steps, args.seed)
    test_dataset = PairDataset(args.test_batch_size, args.seed + 1000)
    train_loader = DataLoader(train_dataset, batch_size=args.batch_size, shuffle=True)
    test_loader = DataLoader(test_dataset, batch_size=args.test_batch_size)

    model = SiameseNetwork()
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)

    state = {"steps": 0}
    epoch = 1
    while state["steps"] < args.steps:
        train(args, model, train_loader, optimizer, epoch, state)
        test(model, test_loader)
        scheduler.step()
        epoch += 1

    if args.save_model:
        with tempfile.TemporaryDirectory() as out:
            torch.save(model.state_dict(), os.path.join(out, "siamese_network.pt"))


if __name__ == "__main__":
    main()
