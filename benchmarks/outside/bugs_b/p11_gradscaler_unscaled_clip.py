"""P11 (class f: clipping scaled gradients under GradScaler) -- plain loop, CPU fp16 autocast.

Modelled on milesial/Pytorch-UNet#468 "Gradients are clipped before the unscaling" (fixed
by PR #470), rwth-i6/returnn#1590 "Torch: gradient_clip wrong when grad_scaler is used" and
pytorch/examples#1196: clip_grad_norm_ is applied to the *scaled* gradients, so with a
loss scale of ~3e4 the effective clip threshold becomes max_norm/scale and updates all
but stop.  Gradient clipping is switched on after a warm-up of 12 steps.
Healthy twin: scaler.unscale_(opt) before clipping.
"""
import sys, torch, torch.nn as nn, torch.nn.functional as F
HEALTHY = "--healthy" in sys.argv
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))
opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 14)
Wt = torch.randn(20, 3)
for step in range(36):
    x = torch.randn(64, 20); y = (x @ Wt).argmax(1)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.cross_entropy(net(x).float(), y)
    opt.zero_grad(); scaler.scale(loss).backward()
    if step >= 12:                                  # clipping enabled after warm-up
        if HEALTHY: scaler.unscale_(opt)
        elif step == 12: print("ONSET step", step, "scale=", scaler.get_scale())
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    w0 = net[0].weight.detach().clone()
    scaler.step(opt); scaler.update()
    if step in (11, 12, 35): print(f"step {step} |dW|={(net[0].weight - w0).norm():.2e} loss={loss.item():.3f}")
