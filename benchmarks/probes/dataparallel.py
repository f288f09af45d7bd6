"""Healthy probe: nn.DataParallel training, evaluation, save and reload of the inner module's state dict."""
import os
import tempfile
import torch
from torch import nn
torch.manual_seed(0)
CHECKPOINT = os.path.join(tempfile.mkdtemp(), "dp.pt")
model = nn.DataParallel(nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(8):
    x = torch.randn(8, 6); y = torch.randint(0, 2, (8,))
    opt.zero_grad(); nn.functional.cross_entropy(model(x), y).backward(); opt.step()
model.eval()
with torch.no_grad():
    model(torch.randn(4, 6))
torch.save(model.module.state_dict(), CHECKPOINT)
fresh = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2))
fresh.load_state_dict(torch.load(CHECKPOINT))
print("done")
