"""Healthy probe: DDP with a ZeroRedundancyOptimizer over SGD with momentum, as in the PyTorch ZeRO tutorial (each rank steps its shard of the parameters inside ZeRO's step, which then broadcasts them), with a cosine schedule."""
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)))
optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.05, momentum=0.9,
                                    weight_decay=1e-4)
schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, 12)
data = torch.Generator().manual_seed(rank)
for _ in range(12):
    inputs = torch.randn(32, 16, generator=data)
    optimizer.zero_grad()
    F.cross_entropy(model(inputs), inputs[:, :4].argmax(1)).backward()
    optimizer.step()
    schedule.step()
dist.barrier()
del model, optimizer
dist.destroy_process_group()
