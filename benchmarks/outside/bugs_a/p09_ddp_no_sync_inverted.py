"""p09 - class 5: DDP (2 ranks, gloo) with a gradient-accumulation ramp (1 micro-batch per step for 12
steps, then 2).  The no_sync condition is inverted: it syncs the FIRST micro-batch and skips the sync on
the micro-batch that precedes optimizer.step(), so each rank steps on rank-local gradients and the
replicas drift apart.  Modelled on: modelscope/FunASR PR #3472 "align DDP no_sync with gradient
accumulation" (old `batch_idx % accum_grad` condition: 4.0 vs 7.0 accumulated gradients across ranks)
and karpathy/build-nanogpt PR #30.  Onset: optimizer step 12 (0-based).  `--healthy` uses
(batch_idx + 1) % accum."""
import sys, contextlib, torch, torch.nn as nn, torch.nn.functional as F, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
healthy = '--healthy' in sys.argv
dist.init_process_group("gloo"); rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(100 + rank)
W = torch.randn(16, 1, generator=torch.Generator().manual_seed(7))
batch_idx = 0
for step in range(36):
    accum = 1 if step < 12 else 2
    if step == 12 and rank == 0 and not healthy: print("ONSET: unsynced step micro-batch from optimizer step 12 (0-based)")
    for micro in range(accum):
        x = torch.randn(32, 16, generator=g); y = torch.tanh(x @ W)
        sync = ((batch_idx + 1) % accum == 0) if healthy else (batch_idx % accum == 0)
        ctx = contextlib.nullcontext() if sync else model.no_sync()
        with ctx:
            loss = F.mse_loss(model(x), y) / accum
            loss.backward()
        batch_idx += 1
    opt.step(); opt.zero_grad()
p = torch.cat([q.detach().flatten() for q in model.parameters()])
ps = [torch.zeros_like(p) for _ in range(2)]; dist.all_gather(ps, p)
if rank == 0: print("max param diff across ranks", (ps[0] - ps[1]).abs().max().item())
dist.destroy_process_group()
