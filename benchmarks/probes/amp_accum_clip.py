"""Healthy probe: the AMP recipe with gradient accumulation (scaler.scale(loss / accum).backward() per micro-batch, then unscale_, clip_grad_norm_, scaler.step, scaler.update once per step) and a scaler whose first steps overflow and are skipped."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**40)  # overflows at first: steps skipped, scale backs off
accum = 4
for step in range(10):
    optimizer.zero_grad(set_to_none=True)
    for _ in range(accum):
        x = torch.randn(8, 10)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            prediction = model(x)
        loss = nn.functional.mse_loss(prediction.float(), x.sum(1, keepdim=True)) / accum
        scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
print("done", scaler.get_scale())
