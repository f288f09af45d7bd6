"""Healthy probe: Monte Carlo dropout for uncertainty: model.eval(), then .train() on its dropout modules alone, several stochastic passes without gradients."""
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(3):
    model.train()
    for step in range(4):
        x = torch.randn(32, 10); y = x.sum(1, keepdim=True)
        opt.zero_grad(); nn.functional.mse_loss(model(x), y).backward(); opt.step()
    model.eval()
    for m in model.modules():
        if isinstance(m, nn.Dropout): m.train()   # Monte Carlo dropout for uncertainty
    with torch.no_grad():
        samples = torch.stack([model(torch.randn(8, 10)) for _ in range(5)])
print("done")
