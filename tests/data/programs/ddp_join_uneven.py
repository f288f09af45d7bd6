"""Two ranks with uneven numbers of batches, kept in step by ``Join``, for three epochs.

    python -m torch.distributed.run --standalone --nproc-per-node 2 ddp_join_uneven.py zero|adamw

``zero``: DDP and a ZeroRedundancyOptimizer are both joinables, so the rank that runs
out first takes its shard's step in every iteration it shadows and the replicas stay
identical.  ``adamw``: only DDP joins; the early rank's AdamW skips the shadowed
updates, so after Join's post hook broadcasts the final model, its moments differ from
its peer's and the replicas drift apart from the next epoch on.  Each epoch ends with an
evaluation (the weights a rank holds after Join are not those its last step left, in
either mode).  Prints the largest
parameter difference from rank 0 after the first step of each epoch but the first.
"""

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

EPOCHS = 3


def difference_from_rank0(model: nn.Module) -> float:
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    reference = flat.clone()
    dist.broadcast(reference, src=0)
    return (flat - reference).abs().max().item()


def main() -> None:
    mode = sys.argv[1]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    ddp = DistributedDataParallel(model)
    if mode == "zero":
        optimizer = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-2)
        joinables = [ddp, optimizer]
    else:
        optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
        joinables = [ddp]
    data = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(8, 8, generator=data), torch.randint(0, 2, (8,), generator=data))
               for _ in range(6 if rank == 0 else 4)]
    largest = 0.0
    for epoch in range(EPOCHS):
        with Join(joinables):
            for index, (inputs, targets) in enumerate(batches):
                optimizer.zero_grad()
                F.cross_entropy(ddp(inputs), targets).backward()
                optimizer.step()
                if epoch and not index:  # every rank is still training here
                    largest = max(largest, difference_from_rank0(model))
        model.eval()  # an evaluation after each joined epoch, as training scripts do
        with torch.no_grad():
            model(batches[0][0])
        model.train()
    print(f"rank {rank} largest difference from rank 0: {largest:.1e}")
    dist.barrier()
    del ddp, optimizer, joinables
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
