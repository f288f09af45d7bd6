"""Healthy: post-local SGD (Lin et al. 2020) exactly as the PyTorch docs for
torch.distributed.optim.PostLocalSGDOptimizer show it: DDP with the post_localSGD_hook
(PostLocalSGDState(start_localSGD_iter=warmup)), the optimizer wrapped in
PostLocalSGDOptimizer(optim, averager=PeriodicModelAverager(period=4, warmup_steps=warmup)): global all-reduce
of gradients for the first `warmup` steps, then purely local steps with the model averaged across ranks every 4th
step. Subgroups are single ranks (new_subgroups(group_size=1)) since there is no GPU node to group by. gloo, 2 ranks,
an all-ranks eval at the end (after a final averaging)."""
import torch
import torch.distributed as dist
from torch import nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
import torch.distributed.algorithms.model_averaging.averagers as averagers
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState, post_localSGD_hook
from torch.distributed.optim import PostLocalSGDOptimizer
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
model = DDP(model)
warmup = 8
subgroup, _ = dist.new_subgroups(group_size=1)
state = PostLocalSGDState(process_group=None, subgroup=subgroup, start_localSGD_iter=warmup)
model.register_comm_hook(state, post_localSGD_hook)
local_optim = torch.optim.SGD(params=model.parameters(), lr=0.05, momentum=0.9)
opt = PostLocalSGDOptimizer(optim=local_optim, averager=averagers.PeriodicModelAverager(period=4, warmup_steps=warmup))
W = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
g = torch.Generator().manual_seed(100 + rank)
for step in range(30):
    x = torch.randn(32, 16, generator=g); y = (x @ W).argmax(1)
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
# final synchronisation of replicas, then evaluation on every rank
with torch.no_grad():
    for p in model.parameters():
        dist.all_reduce(p.data); p.data /= dist.get_world_size()
model.eval()
with torch.no_grad():
    xv = torch.randn(256, 16, generator=torch.Generator().manual_seed(7)); yv = (xv @ W).argmax(1)
    acc = (model(xv).argmax(1) == yv).float().mean().item()
print(f"rank {rank} loss {loss.item():.3f} acc {acc:.3f}")
dist.destroy_process_group()
