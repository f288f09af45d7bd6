"""Healthy probe: PyTorch's pruning tutorial (l1_unstructured, pruning again mid-run) with a weight_norm parametrization."""
import torch
from torch import nn
import torch.nn.utils.prune as prune
from torch.nn.utils.parametrizations import weight_norm
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), weight_norm(nn.Linear(32, 32)), nn.ReLU(), nn.Linear(32, 2))
prune.l1_unstructured(model[0], "weight", amount=0.3)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for step in range(10):
    x = torch.randn(16, 12); y = torch.randint(0, 2, (16,))
    opt.zero_grad(); nn.functional.cross_entropy(model(x), y).backward(); opt.step()
    if step == 5:
        prune.l1_unstructured(model[4], "weight", amount=0.2)
print("done")
