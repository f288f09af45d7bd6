"""A small convnet classifier on synthetic 12x12 "digits", trained like the PyTorch MNIST example.

Modelled on: pytorch/examples MNIST (https://github.com/pytorch/examples/blob/main/mnist/main.py)
Habits reproduced: a ``Net`` with two convolutions, max-pooling, two Dropout layers and
``log_softmax`` + ``F.nll_loss``, Adadelta at lr 1.0 with ``StepLR(step_size=1, gamma)`` stepped
once per epoch, ``train()``/``test()`` functions taking ``(args, model, device, loader, ...)``,
``log_interval`` printing with ``loss.item()``, ``--dry-run`` that stops after one batch, a
summed-loss ``test()`` every epoch under ``torch.no_grad()``, and ``--save-model``.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.conv2 = nn.Conv2d(8, 16, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(16 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


def train(args, model, device, train_loader, optimizer, epoch, budget):
    """Runs one epoch or until ``budget`` optimizer steps are spent; returns the steps taken."""
    model.train()
    taken = 0
    for batch_idx, (data, target) in enumerate(train_loader):
        if taken >= budget:
            break
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        taken += 1
        if batch_idx % args.log_interval == 0:
            print("Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}".format(
                epoch, batch_idx * len(data), len(train_loader.dataset),
                100.0 * batch_idx / len(train_loader), loss.item()))
            if args.dry_run:
                break
    return taken


def test(model, device, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()  # sum up batch loss
            pred = output.argmax(dim=1, keepdim=True)  # get the index of the max log-probability
            correct += pred.eq(target.view_as(pred)).sum().item()

    test_loss /= len(test_loader.dataset)
    print("\nTest set: Average loss: {:.4f}, Accuracy: {}/{} ({:.0f}%)\n".format(
        test_loss, correct, len(test_loader.dataset), 100.0 * correct / len(test_loader.dataset)))


def synthetic_digits(n, seed):
    """Ten fixed random templates, normalised like MNIST, plus per-sample noise."""
    generator = torch.Generator().manual_seed(seed)
    templates = torch.randn(10, 1, 12, 12, generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, 10, (n,), generator=generator)
    images = templates[labels] + 0.8 * torch.randn(n, 1, 12, 12, generator=generator)
    images = (images - 0.1307) / 0.3081
    return TensorDataset(images, labels)


def main():
    parser = argparse.ArgumentParser(description="PyTorch MNIST-style example on synthetic digits")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps in total")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--test-batch-size", type=int, default=64)
    parser.add_argument("--epoch-steps", type=int, default=4, help="batches per epoch")
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    parser.add_argument("--dry-run", action="store_true", default=False)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log-interval", type=int, default=2)
    parser.add_argument("--save-model", action="store_true", default=False)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device("cpu")

    train_kwargs = {"batch_size": args.batch_size, "shuffle": True}
    test_kwargs = {"batch_size": args.test_batch_size}
    train_loader = DataLoader(synthetic_digits(args.batch_size * args.epoch_steps, args.seed), **train_kwargs)
    test_loader = DataLoader(synthetic_digits(args.test_batch_size, args.seed + 1), **test_kwargs)

    model = Net().to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)

    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    steps_left = args.steps
    epoch = 1
    while steps_left > 0:
        steps_left -= train(args, model, device, train_loader, optimizer, epoch, steps_left)
        test(model, device, test_loader)
        scheduler.step()
        epoch += 1
        if args.dry_run:
            break

    if args.save_model:
        with tempfile.TemporaryDirectory() as out:
            torch.save(model.state_dict(), os.path.join(out, "mnist_cnn.pt"))


if __name__ == "__main__":
    main()
