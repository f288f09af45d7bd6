"""Healthy probe: a timm-style image classifier recipe: Mixup, label smoothing, AdamW with no weight decay on norms and biases, warm-up then cosine, clipping, an EMA copy updated from the state dict."""
import copy, math, torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1),
                      nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(32, 10))
decay, no_decay = [], []
for n, p in model.named_parameters():
    (no_decay if p.ndim <= 1 else decay).append(p)
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}], lr=1e-3)
ema = copy.deepcopy(model).eval()
for p in ema.parameters(): p.requires_grad_(False)
total, warm = 12, 3
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / (total - warm))))
crit = nn.CrossEntropyLoss(label_smoothing=0.1)
g = torch.Generator().manual_seed(0)
for step in range(total):
    x = torch.randn(16, 3, 16, 16, generator=g); y = torch.randint(0, 10, (16,), generator=g)
    lam = float(torch.distributions.Beta(0.4, 0.4).sample()); perm = torch.randperm(16, generator=g)
    x = lam * x + (1 - lam) * x[perm]
    out = model(x); loss = lam * crit(out, y) + (1 - lam) * crit(out, y[perm])
    opt.zero_grad(set_to_none=True); loss.backward(); nn.utils.clip_grad_norm_(model.parameters(), 5.0); opt.step(); sched.step()
    with torch.no_grad():
        for e, m in zip(ema.state_dict().values(), model.state_dict().values()):
            if e.dtype.is_floating_point: e.mul_(0.99).add_(m, alpha=0.01)
            else: e.copy_(m)
    if step % 6 == 5:
        with torch.no_grad():
            ema(x); model.eval(); model(x); model.train()
print("done")
