"""Modelled on the PyTorch tutorial "Writing Distributed Applications with PyTorch"
(intermediate/dist_tuto: DataPartitioner/partition_dataset, hand-written
average_gradients() with dist.all_reduce(SUM) / world_size, same torch.manual_seed on every
rank so the replicas start identical), launched with
    torchrun --nproc_per_node 2 dist_allreduce_tutorial.py      (backend gloo, CPU)

Instead of MNIST: synthetic 3-channel 'accelerometer' sequences (4 activity classes) for a
small 1-D conv net.  A few recordings contain NaN sensor dropouts, so the loop checks the
loss for finiteness, agrees across ranks with an all_reduce(MIN) of the flag, and skips the
step on all ranks together (no backward / no gradient all_reduce for that batch).  Also:
initial broadcast check of parameters, StepLR, sharded evaluation whose correct/total
counts are all_reduced, per-epoch loss averaged over ranks, rank-0 checkpoint + barrier, and
a final check that the replicas are still bit-identical."""
import math
from random import Random
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

class Partition(object):
    def __init__(self, data, index):
        self.data = data
        self.index = index
    def __len__(self):
        return len(self.index)
    def __getitem__(self, index):
        data_idx = self.index[index]
        return self.data[data_idx]

class DataPartitioner(object):
    def __init__(self, data, sizes=[0.7, 0.2, 0.1], seed=1234):
        self.data = data
        self.partitions = []
        rng = Random()
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

def make_dataset(n, seed, n_nan=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    t = torch.linspace(0, 4 * math.pi, 64)
    freq = torch.tensor([1.0, 1.5, 2.0, 2.5])[y]
    x = torch.stack([torch.sin(freq[:, None] * t + c) for c in (0.0, 1.0, 2.0)], dim=1)
    x = x * (0.5 + torch.rand(n, 3, 1, generator=g)) + 1.5 * torch.randn(n, 3, 64, generator=g)
    if n_nan:
        bad = torch.randperm(n, generator=g)[:n_nan]
        x[bad, :, 20:30] = float("nan")          # sensor dropout in a few recordings
    return torch.utils.data.TensorDataset(x, y)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv1d(3, 16, kernel_size=5)
        self.conv2 = nn.Conv1d(16, 32, kernel_size=5)
        self.conv2_drop = nn.Dropout(0.1)
        self.fc1 = nn.Linear(32 * 13, 50)
        self.fc2 = nn.Linear(50, 4)
    def forward(self, x):
        x = F.relu(F.max_pool1d(self.conv1(x), 2))
        x = F.relu(F.max_pool1d(self.conv2_drop(self.conv2(x)), 2))
        x = x.flatten(1)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)

def partition_dataset(dataset, global_bsz, shuffle):
    size = dist.get_world_size()
    bsz = global_bsz // size
    partition_sizes = [1.0 / size for _ in range(size)]
    partition = DataPartitioner(dataset, partition_sizes)
    partition = partition.use(dist.get_rank())
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    loader = torch.utils.data.DataLoader(partition, batch_size=bsz, shuffle=shuffle, generator=g)
    return loader, bsz

def average_gradients(model):
    size = float(dist.get_world_size())
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
        param.grad.data /= size

@torch.no_grad()
def evaluate(model, loader):
    model.eval()
    counts = torch.zeros(2)
    for data, target in loader:
        pred = model(data).argmax(1)
        counts += torch.tensor([(pred == target).sum().item(), target.numel()], dtype=torch.float)
    dist.all_reduce(counts, op=dist.ReduceOp.SUM)
    model.train()
    return (counts[0] / counts[1]).item()

def run(rank, size):
    torch.manual_seed(1234)
    train_set, bsz = partition_dataset(make_dataset(1024, 0, n_nan=1), 64, shuffle=True)
    val_set, _ = partition_dataset(make_dataset(256, 1), 128, shuffle=False)
    model = Net()
    # replicas must start identical (same seed on every rank) -- verify once
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    assert torch.equal(flat, ref), "replicas diverged at init"

    optimizer = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    num_batches = math.ceil(len(train_set.dataset) / float(bsz))
    steps, skipped = 0, 0
    for epoch in range(3):                              # 3 epochs x 16 batches
        epoch_loss, n_ok = 0.0, 0
        for data, target in train_set:
            optimizer.zero_grad()
            output = model(data)
            loss = F.nll_loss(output, target)
            finite = torch.tensor([1.0 if torch.isfinite(loss) else 0.0])
            dist.all_reduce(finite, op=dist.ReduceOp.MIN)
            if finite.item() == 0.0:
                skipped += 1
                if rank == 0:
                    print(f"epoch {epoch}: non-finite loss on some rank, skipping this step everywhere")
                continue
            epoch_loss += loss.item(); n_ok += 1
            loss.backward()
            average_gradients(model)
            optimizer.step()
            steps += 1
        scheduler.step()
        mean_loss = torch.tensor([epoch_loss / max(n_ok, 1)])
        dist.all_reduce(mean_loss, op=dist.ReduceOp.SUM)
        acc = evaluate(model, val_set)
        print(f"Rank {dist.get_rank()}, epoch {epoch}: local loss {epoch_loss / max(n_ok, 1):.4f} "
              f"(of {num_batches} batches), global loss {mean_loss.item() / size:.4f}, val acc {acc:.4f}")
        if rank == 0:
            torch.save({"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict()}, "dist_allreduce_ckpt.pt")
        dist.barrier()

    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    assert torch.equal(flat, ref), "replicas diverged"
    if rank == 0:
        print(f"done: {steps} optimizer steps, {skipped} skipped steps, replicas identical")

def init_process(fn, backend="gloo"):
    dist.init_process_group(backend)
    torch.set_num_threads(1)
    fn(dist.get_rank(), dist.get_world_size())
    dist.destroy_process_group()

if __name__ == "__main__":
    init_process(run)
