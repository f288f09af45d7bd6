"""Healthy: DP-SGD (Abadi et al. 2016, the algorithm Opacus implements) written with torch.func as in the PyTorch
"Per-sample-gradients" tutorial: functional_call + vmap(grad(compute_loss)) for per-example gradients, each clipped
to max_grad_norm, summed, Gaussian noise (noise_multiplier * max_grad_norm) added, divided by the batch size and
assigned to p.grad by hand, then optimizer.step() -- no loss.backward() anywhere; Poisson-free fixed-size batches,
and an ordinary eval pass (model.eval(), no_grad)."""
import torch
from torch import nn
import torch.nn.functional as F
from torch.func import functional_call, vmap, grad
torch.manual_seed(0)
model = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.0), nn.Linear(64, 4))
params = {k: v.detach() for k, v in model.named_parameters()}
buffers = {k: v.detach() for k, v in model.named_buffers()}
def compute_loss(params, buffers, sample, target):
    preds = functional_call(model, (params, buffers), (sample.unsqueeze(0),))
    return F.cross_entropy(preds, target.unsqueeze(0))
ft_compute_sample_grad = vmap(grad(compute_loss), in_dims=(None, None, 0, 0))
W = torch.randn(64, 4)
def data(n):
    x = torch.randn(n, 8, 8); return x, (x.flatten(1) @ W).argmax(1)
opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
max_grad_norm, noise_multiplier, B = 1.0, 0.5, 32
for step in range(40):
    x, y = data(B)
    model.train()
    params = {k: v.detach() for k, v in model.named_parameters()}
    per_sample = ft_compute_sample_grad(params, buffers, x, y)
    norms = torch.stack([g.flatten(1).norm(dim=1) for g in per_sample.values()], 1).norm(dim=1)
    factor = (max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
    opt.zero_grad(set_to_none=True)
    for name, p in model.named_parameters():
        g = torch.einsum("i,i...->...", factor, per_sample[name])
        g = g + torch.randn_like(g) * noise_multiplier * max_grad_norm
        p.grad = g / B
    opt.step()
    if step % 10 == 9:
        model.eval()
        with torch.no_grad():
            xv, yv = data(256); logits = model(xv)
            print(f"step {step} val loss {F.cross_entropy(logits, yv).item():.3f} acc {(logits.argmax(1) == yv).float().mean():.2f}")
