"""DDP loses its gradient-sync hooks when the parameters are replaced underneath it
(PyTorch issue 104336).

DDP registers its all-reduce hooks on the parameter objects it saw at wrap time. In the
original report a device round-trip (``.cpu()`` then ``.cuda()``) replaced them; here, on
CPU, the onset step restores a checkpoint with ``load_state_dict(..., assign=True)``,
which likewise swaps in new ``Parameter`` objects. Training continues, the optimizer is
rebuilt over the new parameters, but their gradients are never all-reduced: the replicas
silently diverge. The healthy twin restores the same checkpoint in place.

Launch: ``python -m torch.distributed.run --standalone --nproc-per-node 2 ddp_lost_sync_hooks.py``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

from _common import bug_active, init_gloo, parse_args, shutdown_gloo, shard_generator


def main() -> None:
    args = parse_args(__doc__)
    rank, world = init_gloo()
    data = shard_generator(args.seed, rank)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    checkpoint = {name: value.clone() for name, value in model.module.state_dict().items()}

    model.train()
    for step in range(args.steps):
        if step == args.onset:  # "restart from the last good checkpoint"
            model.module.load_state_dict(checkpoint, assign=bug_active(args, step))
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        x = torch.randn(16, 6, generator=data)
        labels = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), labels)
        loss.backward()
        optimizer.step()
        weight = model.module[2].weight.detach().clone()
        gathered = [torch.empty_like(weight) for _ in range(world)]
        dist.all_gather(gathered, weight)
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f} replica_gap {(gathered[0] - gathered[-1]).abs().max().item():.2e}", flush=True)
    shutdown_gloo()


if __name__ == "__main__":
    main()
