"""P01 (class a: mixed precision lost mid-run) -- plain loop, CPU bf16 autocast.

Modelled on Nerogar/OneTrainer#1156 "[Bug]: Mixed precision training is disabled if
all dtypes are the same" (fixed by PR #1481): autocast is only enabled when the set of
weight dtypes passed to the gate has more than one element.  Here a frozen bf16 text
encoder is part of that dtype list until step 12, when the schedule unfreezes/drops it
from the list ("stage 2"), the remaining dtypes are all fp32, and autocast is silently
turned off for the rest of the run.  Healthy twin: autocast always on.
"""
import sys, torch, torch.nn as nn, torch.nn.functional as F
HEALTHY = "--healthy" in sys.argv
torch.manual_seed(0)
enc = nn.Embedding(100, 32).to(torch.bfloat16).requires_grad_(False)   # frozen bf16 encoder
net = nn.Sequential(nn.Linear(32, 64), nn.LayerNorm(64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 5))
opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
W = torch.randn(32, 5)
def gate(dtypes):                     # the buggy OneTrainer-style gate
    return len(set(dtypes)) > 1
for step in range(36):
    tok = torch.randint(0, 100, (64,))
    y = (enc.weight.float()[tok] @ W).argmax(1)
    dtypes = [torch.float32] + ([torch.bfloat16] if step < 12 else [])  # encoder leaves the list at stage 2
    use_amp = True if HEALTHY else gate(dtypes)
    if not HEALTHY and step == 12: print("ONSET step", step)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_amp):
        logits = net(enc(tok).float())
        loss = F.cross_entropy(logits, y)
    opt.zero_grad(); loss.backward(); opt.step()
    if step in (11, 12, 35): print(f"step {step} logits.dtype={logits.dtype} autocast={use_amp} loss={loss.item():.3f}")
