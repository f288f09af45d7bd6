"""p10 - class 5: DDP (2 ranks, gloo); on a loss spike the job rolls back to the best checkpoint, but only
rank 0 loads it into model.module (DDP broadcasts parameters only at construction), so the replicas
differ from then on.  Modelled on: vllm-project/speculators PR #926 "fix a ddp ckpt bug ... Only rank0
loads ckpt" and mlcommons/algorithmic-efficiency #412 ("rank 0 loads the checkpoint and the remaining
processes don't").  Best checkpoint saved at step 6, rollback before optimizer step 12 (0-based) = onset.
`--healthy` loads the checkpoint on every rank."""
import sys, torch, torch.nn as nn, torch.nn.functional as F, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
healthy = '--healthy' in sys.argv
dist.init_process_group("gloo"); rank = dist.get_rank()
torch.manual_seed(0)
net = nn.Sequential(nn.Conv1d(4, 16, 3, padding=1), nn.ReLU(), nn.Conv1d(16, 16, 3, padding=1), nn.ReLU(),
                    nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(16, 3))
model = DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
g = torch.Generator().manual_seed(100 + rank)
CK = "p10_best.pt"
for step in range(36):
    if step == 12:   # "loss spike detected" -> roll back to best checkpoint
        dist.barrier()
        if healthy or rank == 0:
            model.module.load_state_dict(torch.load(CK, map_location="cpu"))
        if rank == 0 and not healthy: print("ONSET: only rank 0 rolled back, before optimizer step 12 (0-based)")
    x = torch.randn(32, 4, 20, generator=g); y = (x.mean((1, 2)) > 0).long() + (x[:, 0].mean(1) > 0.2).long()
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    if step == 6 and rank == 0:
        torch.save(model.module.state_dict(), CK)
p = torch.cat([q.detach().flatten() for q in model.parameters()])
ps = [torch.zeros_like(p) for _ in range(2)]; dist.all_gather(ps, p)
if rank == 0: print("max param diff across ranks", (ps[0] - ps[1]).abs().max().item())
dist.destroy_process_group()
