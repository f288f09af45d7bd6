"""Modelled on the PyTorch tutorial "Writing Distributed Applications with PyTorch"
(intermediate_source/dist_tuto.rst: Partition / DataPartitioner, average_gradients with
dist.all_reduce, run(rank, size)), with the optimizer replaced by a hand-written momentum SGD
and the max-norm weight constraint of Srivastava et al. (dropout paper) applied after each step.

Exercises: data-parallel training *without* DDP or torch.optim: every rank seeds its model
differently and then receives rank 0's weights via dist.broadcast; each step the gradients are
summed with all_reduce and divided by world size by hand; parameters are updated in place under
torch.no_grad() with momentum buffers kept in a dict; the incoming weight vector of each hidden
unit is then renormalised to norm <= c (a projection step outside the gradient). A final
all_reduce checks that both replicas stayed bit-identical. Launch:
torchrun --nproc_per_node 2 dist_allreduce_manual_sgd.py
"""
import math
import random
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)


class Partition(object):
    def __init__(self, data, index):
        self.data = data
        self.index = index

    def __len__(self):
        return len(self.index)

    def __getitem__(self, index):
        return self.data[self.index[index]]


class DataPartitioner(object):
    def __init__(self, data, sizes=(0.7, 0.2, 0.1), seed=1234):
        self.data = data
        self.partitions = []
        rng = random.Random()
        rng.seed(seed)
        data_len = len(data)
        indexes = [x for x in range(0, data_len)]
        rng.shuffle(indexes)
        for frac in sizes:
            part_len = int(frac * data_len)
            self.partitions.append(indexes[0:part_len])
            indexes = indexes[part_len:]

    def use(self, partition):
        return Partition(self.data, self.partitions[partition])


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(20, 128)
        self.dropout = nn.Dropout(0.3)
        self.fc2 = nn.Linear(128, 3)

    def forward(self, x):
        return F.log_softmax(self.fc2(self.dropout(F.relu(self.fc1(x)))), dim=1)


def make_dataset(n=1536):
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(3, 20, generator=g) * 0.4
    y = torch.randint(0, 3, (n,), generator=g)
    x = centers[y] + torch.randn(n, 20, generator=g)
    return list(zip(x, y))


def partition_dataset():
    dataset = make_dataset()
    size = dist.get_world_size()
    bsz = 128 // size
    partition_sizes = [1.0 / size for _ in range(size)]
    partition = DataPartitioner(dataset, partition_sizes)
    partition = partition.use(dist.get_rank())
    train_set = torch.utils.data.DataLoader(partition, batch_size=bsz, shuffle=True)
    return train_set, bsz


def average_gradients(model):
    size = float(dist.get_world_size())
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
        param.grad.data /= size


@torch.no_grad()
def sgd_momentum_step(model, bufs, lr, momentum=0.9, weight_decay=1e-4):
    for name, p in model.named_parameters():
        d_p = p.grad.add(p, alpha=weight_decay) if p.dim() > 1 else p.grad
        if name not in bufs:
            bufs[name] = d_p.clone()
        else:
            bufs[name].mul_(momentum).add_(d_p)
        p.add_(bufs[name], alpha=-lr)


@torch.no_grad()
def max_norm_(linear, max_norm=2.0):
    norms = linear.weight.norm(dim=1, keepdim=True)
    linear.weight.mul_(torch.clamp(max_norm / (norms + 1e-7), max=1.0))


def run(rank, size):
    torch.manual_seed(1234 + rank)  # replicas start different on purpose...
    train_set, bsz = partition_dataset()
    model = Net()
    for p in model.parameters():  # ...and are synchronised to rank 0 before training
        dist.broadcast(p.data, src=0)
    bufs = {}
    num_batches = math.ceil(len(train_set.dataset) / float(bsz))
    base_lr, total = 0.05, 4 * num_batches
    it = 0
    for epoch in range(4):
        epoch_loss = 0.0
        for data, target in train_set:
            lr = base_lr * 0.5 * (1 + math.cos(math.pi * it / total))
            model.zero_grad()
            output = model(data)
            loss = F.nll_loss(output, target)
            epoch_loss += loss.item()
            loss.backward()
            average_gradients(model)
            sgd_momentum_step(model, bufs, lr)
            max_norm_(model.fc1, max_norm=0.7)
            it += 1
        stats = torch.tensor([epoch_loss / num_batches])
        dist.all_reduce(stats)
        if rank == 0:
            print(f"Rank {rank}, epoch {epoch}: mean loss over ranks {stats.item() / size:.4f}, steps {it}, "
                  f"max row norm {model.fc1.weight.norm(dim=1).max():.3f}")
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    mx, mn = flat.clone(), flat.clone()
    dist.all_reduce(mx, op=dist.ReduceOp.MAX)
    dist.all_reduce(mn, op=dist.ReduceOp.MIN)
    if rank == 0:
        print("replicas in sync:", torch.equal(mx, mn))


if __name__ == "__main__":
    dist.init_process_group("gloo")
    run(dist.get_rank(), dist.get_world_size())
    dist.destroy_process_group()
