"""Healthy probe: MAML on sine regression with torch.func.functional_call and second-order gradients."""
import torch
from torch import nn
from torch.func import functional_call
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1, 40), nn.ReLU(), nn.Linear(40, 40), nn.ReLU(), nn.Linear(40, 1))
meta_opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for it in range(8):
    meta_opt.zero_grad()
    total = 0.0
    for task in range(3):
        a, ph = torch.rand(1) * 4 + 0.1, torch.rand(1) * 3
        xs, xq = torch.rand(10, 1) * 10 - 5, torch.rand(10, 1) * 10 - 5
        ys, yq = a * torch.sin(xs + ph), a * torch.sin(xq + ph)
        params = dict(model.named_parameters())
        loss = nn.functional.mse_loss(functional_call(model, params, (xs,)), ys)
        grads = torch.autograd.grad(loss, list(params.values()), create_graph=True)
        fast = {n: p - 0.01 * g for (n, p), g in zip(params.items(), grads)}
        total = total + nn.functional.mse_loss(functional_call(model, fast, (xq,)), yq)
    (total / 3).backward()
    meta_opt.step()
print("done")
