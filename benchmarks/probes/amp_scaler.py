"""Healthy probe: PyTorch's automatic-mixed-precision recipe: GradScaler with unscale_ before clip_grad_norm_, OneCycleLR, inference_mode validation."""
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 3))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cpu")
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=12)
g = torch.Generator().manual_seed(0)
for step in range(12):
    x = torch.randn(32, 20, generator=g); y = torch.randint(0, 3, (32,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt); scaler.update(); sched.step()
    if step % 4 == 3:
        model.eval()
        with torch.inference_mode():
            val = nn.functional.cross_entropy(model(x), y)
        model.train()
print("done")
