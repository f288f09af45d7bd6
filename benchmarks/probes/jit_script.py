"""Healthy probe: a TorchScript-compiled model (torch.jit.script) trained and evaluated."""
import torch
from torch import nn
torch.manual_seed(0)
class Net(nn.Module):
    def __init__(self):
        super().__init__(); self.a = nn.Linear(8, 16); self.b = nn.Linear(16, 2); self.drop = nn.Dropout(0.1)
    def forward(self, x):
        return self.b(self.drop(torch.relu(self.a(x))))
model = torch.jit.script(Net())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    x = torch.randn(16, 8); y = torch.randint(0, 2, (16,))
    opt.zero_grad(); nn.functional.cross_entropy(model(x), y).backward(); opt.step()
model.eval()
with torch.no_grad():
    model(torch.randn(4, 8))
print("done")
