"""Data-parallel MNIST-style training the Horovod way, written on torch.distributed.

Modelled on: horovod/examples/pytorch/pytorch_mnist.py (a ``DistributedSampler`` with
``set_epoch(epoch)`` every epoch; the learning rate scaled by the number of workers;
parameters and optimizer state broadcast from rank 0 before training; gradients
averaged across workers by an all-reduce of every gradient before the optimizer step,
which is what ``hvd.DistributedOptimizer`` does; test loss and accuracy averaged across
workers with ``metric_average``, an all-reduce of a scalar), with torch.distributed's
gloo collectives standing in for Horovod's.  The model is the example's: two
convolutions with ``Dropout2d``, two linear layers, ``log_softmax`` and ``nll_loss``.

Launch: ``python -m torch.distributed.run --standalone --nproc-per-node 2 horovod_style_mnist.py``.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, kernel_size=3)
        self.conv2 = nn.Conv2d(6, 12, kernel_size=3)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(12 * 2 * 2, 24)
        self.fc2 = nn.Linear(24, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.flatten(1)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def synthetic_digits(count: int, seed: int) -> TensorDataset:
    """16x16 images whose label is decided by a fixed random teacher (the same on every rank)."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(count, 1, 16, 16, generator=generator)
    teacher = torch.randn(256, 10, generator=torch.Generator().manual_seed(1234))
    return TensorDataset(images, (images.flatten(1) @ teacher).argmax(1))


def broadcast_parameters(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    for tensor in model.state_dict().values():
        dist.broadcast(tensor, src=0)
    for state in optimizer.state.values():  # empty before the first step, as in the example
        for value in state.values():
            if torch.is_tensor(value):
                dist.broadcast(value, src=0)


def allreduce_gradients(model: nn.Module, world: int) -> None:
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
            param.grad /= world


def metric_average(value: float, world: int) -> float:
    tensor = torch.tensor(value)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.item() / world


def test(model: nn.Module, loader: DataLoader, world: int) -> tuple[float, float]:
    model.eval()
    loss = correct = 0.0
    with torch.no_grad():
        for images, labels in loader:
            output = model(images)
            loss += F.nll_loss(output, labels, reduction="sum").item()
            correct += float((output.argmax(1) == labels).sum())
    count = len(loader.sampler)
    model.train()
    return metric_average(loss / count, world), metric_average(correct / count, world)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    train_set = synthetic_digits(4 * args.batch_size, args.seed)  # two batches per rank and epoch
    test_set = synthetic_digits(2 * args.batch_size, args.seed + 100)
    train_sampler = DistributedSampler(train_set, num_replicas=world, rank=rank)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_loader = DataLoader(test_set, batch_size=args.batch_size,
                             sampler=DistributedSampler(test_set, num_replicas=world, rank=rank))

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * world, momentum=0.5)
    broadcast_parameters(model, optimizer)

    model.train()
    step = epoch = 0
    while step < args.steps:
        train_sampler.set_epoch(epoch)
        for images, labels in train_loader:
            optimizer.zero_grad()
            loss = F.nll_loss(model(images), labels)
            loss.backward()
            allreduce_gradients(model, world)
            optimizer.step()
            step += 1
            if step >= args.steps:
                break
        test_loss, accuracy = test(model, test_loader, world)
        if rank == 0:
            print(f"epoch {epoch} step {step} loss {loss.item():.4f} test_loss {test_loss:.4f} "
                  f"test_acc {accuracy:.3f}", flush=True)
        epoch += 1
    dist.barrier()  # leave together: a rank exiting mid-collective makes gloo abort its peer
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
