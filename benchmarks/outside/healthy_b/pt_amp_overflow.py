"""Modelled on the PyTorch 'Automatic Mixed Precision examples' docs (torch.amp): the
'Working with Unscaled Gradients / gradient clipping' loop — scaler.scale(loss).backward();
scaler.unscale_(optimizer); clip_grad_norm_; scaler.step(optimizer); scaler.update() — here on CPU
with float16 autocast. A large init_scale and a short growth_interval make the scaler skip the
first steps (inf/NaN gradients) and periodically again after growing, as happens in real fp16 runs;
the scheduler is stepped every iteration as most code does. MLP regressor with a sum-reduced loss."""
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
N, D = 1024, 32
X = torch.randn(N, D); W = torch.randn(D, 1); Y = torch.tanh(X @ W) + 0.05 * torch.randn(N, 1)
Xv, Yv = X[:128], Y[:128]; X, Y = X[128:], Y[128:]
model = nn.Sequential(nn.Linear(D, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=20, gamma=0.5)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=8)
skipped = 0; step = 0
for epoch in range(4):
    perm = torch.randperm(len(X))
    model.train()
    for i in range(0, len(X), 64):
        idx = perm[i:i + 64]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(X[idx])
            loss = F.mse_loss(out.float(), Y[idx], reduction="sum")
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        scale_before = scaler.get_scale()
        scaler.step(opt); scaler.update()
        if scaler.get_scale() < scale_before: skipped += 1
        sched.step(); step += 1
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        vl = F.mse_loss(model(Xv).float(), Yv).item()
    print(f"epoch {epoch} step {step} val_mse {vl:.4f} scale {scaler.get_scale():.0f} skipped {skipped}")
