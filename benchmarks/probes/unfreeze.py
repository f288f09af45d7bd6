"""Healthy probe: ULMFiT-style gradual unfreezing: a frozen backbone joins the optimizer with add_param_group mid-run."""
import torch
from torch import nn
torch.manual_seed(0)
backbone = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
head = nn.Linear(32, 3)
model = nn.Sequential(backbone, head)
for p in backbone.parameters(): p.requires_grad = False
opt = torch.optim.Adam(head.parameters(), lr=1e-3)
for step in range(12):
    if step == 6:  # gradual unfreezing: the backbone joins with a smaller learning rate
        for p in backbone.parameters(): p.requires_grad = True
        opt.add_param_group({"params": backbone.parameters(), "lr": 1e-4})
    x = torch.randn(16, 10); y = torch.randint(0, 3, (16,))
    opt.zero_grad(); nn.functional.cross_entropy(model(x), y).backward(); opt.step()
print("done")
