"""Healthy probe: SWATS-style optimizer switch: Adam replaced by SGD mid-run."""
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(12):
    if step == 6:  # switch Adam -> SGD (SWATS-style)
        opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    x = torch.randn(16, 10); y = x.sum(1, keepdim=True)
    opt.zero_grad(); nn.functional.mse_loss(model(x), y).backward(); opt.step()
print("done")
