"""p04 - class 2: hand-written SGD (no torch.optim); a linear-probe evaluation freezes the encoder with
requires_grad=False and never unfreezes it.  Modelled on: nttcslab/byol-a #7 "Model parameters cannot be
trainable once they become requires_grad=False" and yunxiaoshi/Neural-IMage-Assessment #41 (freeze,
then 'after some epoch you should turn it back to True').  Bug: from step 12 the manual update loop
(which skips params whose .grad is None) only trains the head.  Onset: update step 12 (0-based).
`--healthy` restores requires_grad after the probe."""
import sys, torch, torch.nn as nn, torch.nn.functional as F
healthy = '--healthy' in sys.argv
torch.manual_seed(0)
enc = nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 32), nn.Tanh())
head = nn.Linear(32, 1)
params = list(enc.parameters()) + list(head.parameters())
W = torch.randn(20, 1)
g = torch.Generator().manual_seed(1)
def batch():
    x = torch.randn(64, 20, generator=g); return x, torch.sin(x @ W)
def linear_probe():
    flags = [p.requires_grad for p in enc.parameters()]
    for p in enc.parameters(): p.requires_grad_(False)      # freeze backbone for the probe
    x, y = batch(); f = enc(x); f1 = torch.cat([f, torch.ones(len(f), 1)], 1)
    w = torch.linalg.lstsq(f1, y).solution
    r = F.mse_loss(f1 @ w, y).item()
    if healthy:
        for p, fl in zip(enc.parameters(), flags): p.requires_grad_(fl)
    return r
lr = 0.05
for step in range(36):
    if step == 12:
        print("probe mse", linear_probe())
        if not healthy: print("ONSET: encoder frozen from update step 12 (0-based)")
    x, y = batch()
    loss = F.mse_loss(head(enc(x)), y)
    loss.backward()
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr); p.grad = None
print("final loss", loss.item())
