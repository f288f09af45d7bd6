"""Healthy: fairseq's Trainer.train_step overflow handling (and HF accelerate/DeepSpeed-style "skip the update when
the gradient norm is not finite"): loss.backward(), grad_norm = clip_grad_norm_(..., max_norm); if the norm is
inf/NaN the update is skipped (optimizer.zero_grad(), "overflow detected, ignoring gradient", no optimizer or
scheduler step) -- here triggered by a batch whose input holds an inf, as a corrupt record would; also a
collate that drops empty/invalid records and skips a batch that ends up empty before any forward (as detection
loaders do for images without boxes). Inverse-sqrt LR schedule with warmup, Adam, eval every 10 updates."""
import torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(20, 64), nn.LayerNorm(64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 5))
opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-8)
warmup = 8
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: min((u + 1) / warmup, (warmup / (u + 1)) ** 0.5))
W = torch.randn(20, 5)
def raw_batch(i):
    x = torch.randn(16, 20); y = (x @ W).argmax(1); valid = torch.ones(16, dtype=torch.bool)
    if i == 13: valid[:] = False                  # a batch with no usable records
    if i == 21: x[3, 7] = float("inf")            # a corrupt record that slips through
    return x, y, valid
def collate(x, y, valid): return x[valid], y[valid]
def evaluate():
    model.eval()
    with torch.no_grad():
        x = torch.randn(256, 20); y = (x @ W).argmax(1); out = model(x)
    model.train(); return F.cross_entropy(out, y).item(), (out.argmax(1) == y).float().mean().item()
updates, skipped = 0, 0
for i in range(50):
    x, y = collate(*raw_batch(i))
    if x.numel() == 0:
        print(f"batch {i}: empty after filtering, skipped"); continue
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if not torch.isfinite(grad_norm):
        print(f"batch {i}: overflow detected (grad norm {grad_norm.item()}), ignoring gradient"); skipped += 1
        opt.zero_grad(); continue
    opt.step(); sched.step(); opt.zero_grad(); updates += 1
    if updates % 10 == 0:
        print(f"update {updates} loss {loss.item():.3f} val {evaluate()}")
print(f"{updates} updates, {skipped} skipped")
