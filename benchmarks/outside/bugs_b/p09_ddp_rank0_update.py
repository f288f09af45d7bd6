"""P09 (class e: a parameter updated on one rank only) -- DDP, 2 ranks, gloo.

Modelled on iCog-Labs-Dev/PC-Transformers PR #135 "DDP Synchronization" (weights
updated directly, outside backward, bypass DDP gradient synchronisation, so ranks keep
different weights) and the forum pattern of guarding extra work with `if rank == 0`.
From step 12 a max-norm constraint on the first layer (a renorm done in place after
opt.step()) is applied only on rank 0 -- it was put inside the rank-0 logging block --
so the replicas' weights diverge.  Healthy twin: the renorm runs on every rank.
"""
import sys, torch, torch.nn as nn, torch.nn.functional as F, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
HEALTHY = "--healthy" in sys.argv
dist.init_process_group("gloo"); rank = dist.get_rank()
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2))
model = DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
g = torch.Generator().manual_seed(100 + rank)
for step in range(36):
    x = torch.randn(32, 16, generator=g) * 3; y = (x[:, 0] > 0).long()
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    if step >= 12 and (HEALTHY or rank == 0):
        if step == 12 and not HEALTHY and rank == 0: print("ONSET step", step)
        with torch.no_grad():
            net[0].weight.copy_(torch.renorm(net[0].weight, 2, 0, 0.5))
    if step in (11, 12, 35):
        w = net[0].weight.detach().clone(); w0 = w.clone(); dist.broadcast(w0, 0)
        if rank == 1: print(f"step {step} rank1-vs-rank0 |dW|={(w - w0).norm():.3e}")
dist.destroy_process_group()
