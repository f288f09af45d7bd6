"""Silent data corruption in a collective transfer (PyTorch issues 84803 and 96600,
Baichuan2 issue 86: faulty GPU peer-to-peer links).

Two ranks average gradients by hand with ``all_reduce``. From the onset, the buffer
rank 1 receives is corrupted in transit: about 5% of its elements arrive as zeros (the
pattern seen in the P2P reports). Nothing errors; rank 1 steps on slightly wrong
gradients and its replica silently drifts from rank 0's.

Launch: ``python -m torch.distributed.run --standalone --nproc-per-node 2 allreduce_corruption.py``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from _common import bug_active, init_gloo, parse_args, shutdown_gloo, shard_generator


def corrupt_in_transit(buffer: torch.Tensor, generator: torch.Generator) -> None:
    """What the faulty link does to a received buffer: zero a few elements."""
    lost = torch.rand(buffer.shape, generator=generator) < 0.05
    lost.view(-1)[0] = True  # at least one element, so every corrupted transfer shows
    buffer.masked_fill_(lost, 0.0)


def main() -> None:
    args = parse_args(__doc__)
    rank, world = init_gloo()
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(8, 24), nn.ReLU(), nn.Linear(24, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = shard_generator(args.seed, rank)
    link_noise = torch.Generator().manual_seed(1234)

    model.train()
    for step in range(args.steps):
        x = torch.randn(32, 8, generator=data)
        labels = (x[:, 0] + x[:, 1] > 0).long()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), labels)
        loss.backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)
            if bug_active(args, step) and rank == 1:
                corrupt_in_transit(param.grad, link_noise)
            param.grad.div_(world)
        optimizer.step()
        weight = model[0].weight.detach().clone()
        gathered = [torch.empty_like(weight) for _ in range(world)]
        dist.all_gather(gathered, weight)
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f} replica_gap {(gathered[0] - gathered[-1]).abs().max().item():.2e}", flush=True)
    shutdown_gloo()


if __name__ == "__main__":
    main()
