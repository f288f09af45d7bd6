"""Iterative magnitude pruning with rewinding to the original initialisation (lottery tickets).

Modelled on: rahulvigneswaran/Lottery-Ticket-Hypothesis-in-Pytorch ``main.py`` (Frankle &
Carbin, "The Lottery Ticket Hypothesis", ICLR 2019): ``initial_state_dict =
copy.deepcopy(model.state_dict())``, ``make_mask``, ``prune_by_percentile`` (layer-wise
percentile of the surviving weights), ``original_initialization`` (surviving weights
reset to their initial values, biases reset too), a new Adam (``weight_decay=1e-4``)
for every pruning iteration, gradients of pruned weights zeroed between
``backward()`` and ``step()``, validation every ``valid_freq`` iterations with the best
model saved with ``torch.save``; LeNet-300-100 ("fc1") architecture.  Here the
gradient freezing multiplies by the stored mask.

What is unusual about the loop (all on purpose):
  * the whole network is rewound to its step-0 weights twice during the run (weights
    jump back, loss jumps back up), and a fresh optimizer is created each time;
  * after each rewind 20 % more of the surviving weights are exactly 0 and stay 0
    (their gradient is zeroed, so Adam's moments and the decoupled L2 term stay 0 too);
  * each round saves its best checkpoint to a temp dir and the final ticket is reloaded
    from it and re-evaluated (identical accuracy checked).
"""
import copy
import os
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
torch.manual_seed(1)
np.random.seed(1)


class fc1(nn.Module):
    def __init__(self, num_classes=10, in_features=64):
        super().__init__()
        self.classifier = nn.Sequential(
            nn.Linear(in_features, 300), nn.ReLU(inplace=True),
            nn.Linear(300, 100), nn.ReLU(inplace=True),
            nn.Linear(100, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(x, 1))


def make_digits(n, seed):
    """8x8 'digit' prototypes + pixel noise + random brightness."""
    protos = (torch.rand(10, 64, generator=torch.Generator().manual_seed(0)) > 0.6).float()
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    x = protos[y] * (0.7 + 0.6 * torch.rand(n, 1, generator=g)) + 0.35 * torch.randn(n, 64, generator=g)
    return x, y


def make_mask(model):
    return [np.ones_like(p.data.numpy()) for name, p in model.named_parameters() if "weight" in name]


def prune_by_percentile(model, mask, percent):
    step = 0
    for name, param in model.named_parameters():
        if "weight" in name:
            tensor = param.data.numpy()
            alive = tensor[np.nonzero(tensor)]
            percentile_value = np.percentile(abs(alive), percent)
            new_mask = np.where(abs(tensor) < percentile_value, 0, mask[step])
            param.data = torch.from_numpy(tensor * new_mask).float()
            mask[step] = new_mask
            step += 1


def original_initialization(model, mask, initial_state_dict):
    step = 0
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "weight" in name:
                param.copy_(torch.from_numpy(mask[step]) * initial_state_dict[name])
                step += 1
            if "bias" in name:
                param.copy_(initial_state_dict[name])


def train(model, train_loader, optimizer, mask):
    model.train()
    imgs, targets = next(train_loader)
    optimizer.zero_grad()
    train_loss = F.cross_entropy(model(imgs), targets)
    train_loss.backward()
    step = 0
    for name, p in model.named_parameters():  # freeze pruned weights by zeroing their gradients
        if "weight" in name:
            p.grad.mul_(torch.from_numpy(mask[step]).to(p.grad.dtype))
            step += 1
    optimizer.step()
    return train_loss.item()


@torch.no_grad()
def test(model, loader):
    model.eval()
    correct = sum((model(x).argmax(1) == y).sum().item() for x, y in loader)
    return 100.0 * correct / len(loader.dataset)


def infinite(loader):
    while True:
        yield from loader


def sparsity(model):
    w = [p for n, p in model.named_parameters() if "weight" in n]
    return sum((p == 0).sum().item() for p in w) / sum(p.numel() for p in w)


def main():
    x, y = make_digits(2000, 1)
    tx, ty = make_digits(500, 2)
    train_loader = infinite(DataLoader(TensorDataset(x, y), batch_size=60, shuffle=True, drop_last=True))
    test_loader = DataLoader(TensorDataset(tx, ty), batch_size=250)
    model = fc1()
    initial_state_dict = copy.deepcopy(model.state_dict())
    mask = make_mask(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1.2e-3, weight_decay=1e-4)
    iterations, end_iter, valid_freq, prune_percent = 3, 16, 4, 20

    with tempfile.TemporaryDirectory() as save_dir:
        for _ite in range(iterations):
            if _ite != 0:
                prune_by_percentile(model, mask, prune_percent)
                original_initialization(model, mask, initial_state_dict)
                optimizer = torch.optim.Adam(model.parameters(), lr=1.2e-3, weight_decay=1e-4)
            print(f"--- pruning level {_ite}: weight sparsity {sparsity(model):.3f}, "
                  f"acc at rewound init {test(model, test_loader):.1f}%")
            best_accuracy, best_path = 0.0, os.path.join(save_dir, f"{_ite}_model_lt.pth.tar")
            loss = float("nan")
            for iter_ in range(end_iter + 1):
                if iter_ % valid_freq == 0:
                    accuracy = test(model, test_loader)
                    if accuracy > best_accuracy:
                        best_accuracy = accuracy
                        torch.save({"state_dict": model.state_dict(), "mask": mask}, best_path)
                    if iter_ > 0:
                        print(f"  iter {iter_}: loss {loss:.4f} test acc {accuracy:.1f}% (best {best_accuracy:.1f}%)")
                if iter_ < end_iter:
                    loss = train(model, train_loader, optimizer, mask)
            pruned_nonzero = sum(((p != 0) & (torch.from_numpy(m) == 0)).sum().item()
                                 for (n, p), m in zip([(n, p) for n, p in model.named_parameters() if "weight" in n], mask))
            assert pruned_nonzero == 0, "a pruned weight moved"

        ticket = fc1()
        ckpt = torch.load(best_path, weights_only=False)
        ticket.load_state_dict(ckpt["state_dict"])
        reloaded = test(ticket, test_loader)
        assert reloaded == best_accuracy, (reloaded, best_accuracy)
        print(f"final ticket: sparsity {sparsity(ticket):.3f}, reloaded best acc {reloaded:.1f}%")


if __name__ == "__main__":
    main()
