"""Healthy: DistributedDataParallel(model, find_unused_parameters=True) as required by models with data-dependent
branches (the DDP notes' "unused parameters" case; e.g. detectron2/mmdet configs with find_unused_parameters=True):
a shared encoder with two task heads where each rank routes its batch to head (step + rank) % 2, so a head can be
unused on one rank but used on the other, and an auxiliary head that runs only every third step (globally unused
otherwise). gloo backend, DistributedSampler with set_epoch, SGD+momentum, and an all-ranks evaluation whose accuracy
is all_reduced."""
import torch
import torch.distributed as dist
from torch import nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset, DistributedSampler
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
class Router(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.heads = nn.ModuleList([nn.Linear(32, 3), nn.Linear(32, 3)])
        self.aux = nn.Linear(32, 1)
    def forward(self, x, head, use_aux):
        h = self.enc(x)
        out = self.heads[head](h)
        aux = self.aux(h).squeeze(-1) if use_aux else None
        return out, aux
g = torch.Generator().manual_seed(1)
X = torch.randn(512, 10, generator=g); Y = (X[:, :3].argmax(1)); A = X.norm(dim=1)
ds = TensorDataset(X, Y, A)
sampler = DistributedSampler(ds, shuffle=True, seed=0)
loader = DataLoader(ds, batch_size=16, sampler=sampler)
model = DDP(Router(), find_unused_parameters=True)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
step = 0
for epoch in range(2):
    sampler.set_epoch(epoch); model.train()
    for x, y, a in loader:
        use_aux = step % 3 == 0
        out, aux = model(x, (step + rank) % 2, use_aux)
        loss = F.cross_entropy(out, y)
        if use_aux: loss = loss + 0.1 * F.mse_loss(aux, a)
        opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
        step += 1
        if step >= 25: break
    model.eval(); correct = torch.zeros(2)
    with torch.no_grad():
        for x, y, a in DataLoader(TensorDataset(X[:128], Y[:128], A[:128]), batch_size=64):
            out, _ = model(x, 0, False); correct += torch.tensor([(out.argmax(1) == y).sum().item(), len(y)])
    dist.all_reduce(correct)
    if rank == 0: print(f"epoch {epoch} step {step} loss {loss.item():.3f} acc {correct[0] / correct[1]:.3f}")
dist.destroy_process_group()
