"""p01 - class 1: autocast silently dropped after an evaluation pass (plain loop, CNN+BatchNorm, CPU bf16).
Modelled on: neuralmagic/sparseml PR #949 "Option to eval w/o amp during training" (eval toggles the
AMP flag off) and intel/auto-round PR #2393 (a run that asked for mixed precision computes its loss
outside autocast, silently). Bug: evaluate() sets cfg.use_amp=False for an fp32 eval and never restores
it, so every later training forward runs in fp32.  Onset: optimizer step 12 (0-based) - the first step
after the eval at step 12.  `--healthy` restores the flag."""
import sys, torch, torch.nn as nn, torch.nn.functional as F
healthy = '--healthy' in sys.argv
torch.manual_seed(0)
class Cfg: use_amp = True
cfg = Cfg()
model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                      nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
g = torch.Generator().manual_seed(1)
def batch():
    return torch.randn(32, 3, 16, 16, generator=g), torch.randint(0, 10, (32,), generator=g)
def evaluate():
    saved = cfg.use_amp
    cfg.use_amp = False          # evaluate in full precision
    model.eval()
    with torch.no_grad():
        x, y = batch(); l = F.cross_entropy(model(x), y).item()
    model.train()
    if healthy:
        cfg.use_amp = saved
    return l
for step in range(36):
    if step == 12:
        print("val loss", evaluate())
        if not healthy: print("ONSET: autocast off from optimizer step 12 (0-based)")
    x, y = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.use_amp):
        loss = F.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
print("final loss", loss.item())
