"""Two-rank DDP training where rank 0 alone evaluates (no gradients, model in eval) and
saves a checkpoint every few steps, as many training scripts do. Healthy."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    steps, checkpoint_dir = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 3))
        model = DistributedDataParallel(net)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        data = torch.Generator().manual_seed(rank + 10)
        for step in range(steps):
            model.train()
            inputs, targets = torch.randn(16, 12, generator=data), torch.randint(0, 3, (16,), generator=data)
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(inputs), targets).backward()
            optimizer.step()
            if rank == 0 and step % 3 == 2:
                net.eval()
                with torch.no_grad():
                    net(torch.randn(32, 12, generator=data))
                torch.save(net.state_dict(), os.path.join(checkpoint_dir, f"step{step}.pt"))
            dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
