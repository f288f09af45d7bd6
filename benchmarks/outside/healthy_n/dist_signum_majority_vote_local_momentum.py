"""Distributed Signum with majority vote: 1-bit-style gradient compression over 2 gloo ranks.

Modelled on: jiaweizzhao/signSGD-with-Majority-Vote (``benchmark/.../Signum_optimizer.py`` and
``benchmark_main.py``), the reference code of Bernstein, Zhao, Azizzadenesheli & Anandkumar,
"signSGD with Majority Vote is Communication Efficient and Fault Tolerant", ICLR 2019.

Launch:  python -m torch.distributed.run --standalone --nproc-per-node 2 FILE.py

What is unusual about the loop (deliberate):
  * No DistributedDataParallel and no gradient all-reduce.  Each worker keeps its *own*
    momentum buffer (rank-local state that legitimately differs between ranks), sends only
    ``sign(momentum)`` (packed into int8), and the server-free "vote" is an all-reduce SUM of
    the signs.  Every rank applies ``lr * sign(vote)``, so the weights stay bit-identical while
    the optimizer state does not.
  * With two voters a disagreement is a tie: ``sign(0) == 0`` and that coordinate is left
    unchanged for the step (by design of majority vote).
  * Weight decay is folded into the gradient before the momentum, as in the Signum code.
  * BatchNorm running statistics are also rank-local while training; they are averaged across
    ranks (all-reduce / world size) before each evaluation.
  * The step-decay LR schedule is driven by hand; a final check all-gathers a weight checksum to
    confirm the replicas agree, and shows that the momentum buffers do not.
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.optim import Optimizer
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

torch.set_num_threads(1)


class SignumMajorityVote(Optimizer):
    def __init__(self, params, lr=1e-3, momentum=0.9, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            local_signs = []
            for p in params:
                d_p = p.grad
                if group["weight_decay"] != 0:
                    d_p = d_p.add(p, alpha=group["weight_decay"])
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                buf = state["momentum_buffer"]
                buf.mul_(group["momentum"]).add_(d_p, alpha=1 - group["momentum"])
                local_signs.append(torch.sign(buf).to(torch.int8).flatten())
            # one flat int8 message per group, summed across workers = the vote
            votes = torch.cat(local_signs)
            dist.all_reduce(votes, op=dist.ReduceOp.SUM)
            offset = 0
            for p in params:
                n = p.numel()
                p.add_(torch.sign(votes[offset:offset + n].float()).view_as(p), alpha=-group["lr"])
                offset += n
        return loss


class Net(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc = nn.Linear(32 * 4 * 4, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(torch.flatten(x, 1))


def make_data(n, gen):
    protos = torch.randn(10, 3, 16, 16, generator=torch.Generator().manual_seed(11))
    y = torch.randint(0, 10, (n,), generator=gen)
    x = protos[y] + 1.5 * torch.randn(n, 3, 16, 16, generator=gen)
    return TensorDataset(x, y)


def average_bn_buffers(model, world):
    """BatchNorm running statistics are rank-local during training; average them before eval."""
    for name, buf in model.named_buffers():
        if "running_mean" in name or "running_var" in name:
            dist.all_reduce(buf)
            buf.div_(world)


def evaluate(model, loader):
    average_bn_buffers(model, dist.get_world_size())
    model.eval()
    stats = torch.zeros(3)
    with torch.no_grad():
        for x, y in loader:
            out = model(x)
            stats += torch.tensor([F.cross_entropy(out, y, reduction="sum").item(),
                                   (out.argmax(1) == y).sum().item(), len(y)])
    dist.all_reduce(stats)
    model.train()
    return stats[0].item() / stats[2].item(), stats[1].item() / stats[2].item()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234 + rank)  # different dropout/augmentation streams per worker

    train_set = make_data(1536, torch.Generator().manual_seed(0))
    test_set = make_data(512, torch.Generator().manual_seed(1))
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=0)
    train_loader = DataLoader(train_set, batch_size=32, sampler=sampler)
    test_loader = DataLoader(test_set, batch_size=128,
                             sampler=DistributedSampler(test_set, num_replicas=world, rank=rank, shuffle=False))

    model = Net()
    for p in model.state_dict().values():  # identical starting point on every worker
        dist.broadcast(p, src=0)
    base_lr = 1e-3
    optimizer = SignumMajorityVote(model.parameters(), lr=base_lr, momentum=0.9, weight_decay=1e-4)
    epochs, lr_decay_epochs = 3, (2,)

    step = 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        lr = base_lr * (0.1 ** sum(epoch >= e for e in lr_decay_epochs))
        for g in optimizer.param_groups:
            g["lr"] = lr
        for x, y in train_loader:
            # light per-worker augmentation: random horizontal flips from the rank's own RNG
            flip = torch.rand(x.size(0)) < 0.5
            x = torch.where(flip[:, None, None, None], x.flip(-1), x)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if step % 8 == 0 and rank == 0:
                print(f"epoch {epoch} step {step} lr {lr:.1e} loss {loss.item():.4f}")
        val_loss, val_acc = evaluate(model, test_loader)
        if rank == 0:
            print(f"epoch {epoch}: val loss {val_loss:.4f} val acc {val_acc:.3f}")

    # replicas must agree on the weights; momentum buffers are rank-local and need not agree
    w_sum = torch.stack([torch.cat([p.detach().flatten() for p in model.parameters()]).double().sum()])
    m_sum = torch.stack([torch.cat([optimizer.state[p]["momentum_buffer"].flatten()
                                    for p in model.parameters()]).double().abs().sum()])
    ws, ms = [torch.zeros_like(w_sum) for _ in range(world)], [torch.zeros_like(m_sum) for _ in range(world)]
    dist.all_gather(ws, w_sum)
    dist.all_gather(ms, m_sum)
    if rank == 0:
        print("weight checksums per rank:", [f"{t.item():.6f}" for t in ws])
        print("momentum |m| sums per rank:", [f"{t.item():.6f}" for t in ms])
        print(f"total optimizer steps: {step}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
