"""Healthy probe: Mean Teacher semi-supervised learning: an EMA teacher kept in training mode (dropout noise by design) and run without gradients."""
import copy, torch
from torch import nn
torch.manual_seed(0)
student = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 3))
teacher = copy.deepcopy(student)
for p in teacher.parameters(): p.requires_grad_(False)
opt = torch.optim.Adam(student.parameters(), lr=1e-3)
for step in range(10):
    x = torch.randn(32, 10); y = torch.randint(0, 3, (32,)); labeled = torch.arange(32) < 8
    out = student(x + 0.1 * torch.randn_like(x))
    with torch.no_grad():
        t_out = teacher(x + 0.1 * torch.randn_like(x))   # teacher kept in train mode: dropout noise by design
    loss = nn.functional.cross_entropy(out[labeled], y[labeled]) + nn.functional.mse_loss(out.softmax(1), t_out.softmax(1))
    opt.zero_grad(); loss.backward(); opt.step()
    with torch.no_grad():
        for tp, sp in zip(teacher.parameters(), student.parameters()): tp.mul_(0.99).add_(sp, alpha=0.01)
print("done")
