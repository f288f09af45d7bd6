"""Healthy probe: multi-task training that samples one task head per step (shared trunk, per-task heads)."""
import torch, random
from torch import nn
torch.manual_seed(0); random.seed(0)
trunk = nn.Sequential(nn.Linear(10, 32), nn.ReLU())
heads = nn.ModuleDict({"a": nn.Linear(32, 2), "b": nn.Linear(32, 5)})
params = list(trunk.parameters()) + list(heads.parameters())
opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
for step in range(12):
    task = random.choice(["a", "b"])
    x = torch.randn(16, 10); y = torch.randint(0, 2 if task == "a" else 5, (16,))
    opt.zero_grad()
    loss = nn.functional.cross_entropy(heads[task](trunk(x)), y)
    loss.backward(); opt.step()
print("done")
