"""Stale autocast weight cache: optimizer.step() inside a long-lived autocast region.

Bug class: mixed precision (autocast cast-cache reuse across in-place weight updates).

Modelled on: X-GenGroup/Flow-Factory#186 "[trainer,docs] fix: per-forward
autocast to avoid stale weight cache (zero KL / frozen fp32 training)".  A single
outer ``with torch.autocast(...)`` wrapped the whole optimisation loop.
Autocast caches the low-precision copy of every fp32 leaf parameter the first
time it is cast and only drops that cache when the *outermost* autocast region
exits.  ``optimizer.step()`` updates the fp32 master weights in place, but the
following forward passes inside the same region keep using the cached bf16
copies made at the first forward -- the model the loss is computed on never
changes, so training silently stalls (flat loss, gradients always taken at the
same stale point).  The PyTorch AMP docs only say autocast "should wrap only the
forward pass(es)"; nothing raises.

Setup: the first ``FP32_WARMUP_STEPS`` steps run in plain fp32 (a common
stability trick), then the rest of the run switches to bf16 autocast.  In the
buggy variant the bf16 phase is written as one ``with torch.autocast(...)``
block around the remaining loop (forward, backward and optimizer step).

Healthy twin: enters autocast per step, around the forward/loss only, so the
cast cache is cleared after every iteration.

Onset: the bf16 phase starts at step 12.  Step 12 itself still sees fresh
weights (the cache is filled by its own forward); step 13 is the first optimizer
step whose forward pass runs on stale cached weights, so K = 13.
"""
import sys
from contextlib import nullcontext
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)
torch.manual_seed(0)

D_IN, HIDDEN, N_CLASSES = 32, 128, 8
BATCH = 64
TOTAL_STEPS = 50
FP32_WARMUP_STEPS = 12

teacher = torch.randn(D_IN, N_CLASSES)


def get_batch():
    x = torch.randn(BATCH, D_IN)
    y = (x @ teacher + 0.5 * torch.randn(BATCH, N_CLASSES)).argmax(1)
    return x, y


model = nn.Sequential(
    nn.Linear(D_IN, HIDDEN), nn.GELU(),
    nn.Linear(HIDDEN, HIDDEN), nn.GELU(),
    nn.Linear(HIDDEN, N_CLASSES),
)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)


def train_step(step, use_amp, forward_ctx=nullcontext):
    x, y = get_batch()
    optimizer.zero_grad(set_to_none=True)
    with forward_ctx():
        logits = model(x)
        loss = F.cross_entropy(logits.float(), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    if step % 4 == 0 or step == TOTAL_STEPS - 1:
        acc = (logits.argmax(1) == y).float().mean().item()
        print(f"step {step:3d} loss {loss.item():.4f} acc {acc:.3f} amp={use_amp}")


# phase 1: fp32 warm-up
for step in range(FP32_WARMUP_STEPS):
    train_step(step, use_amp=False)

# phase 2: bf16 mixed precision for the rest of the run
bf16_autocast = partial(torch.autocast, "cpu", dtype=torch.bfloat16)
if HEALTHY:
    for step in range(FP32_WARMUP_STEPS, TOTAL_STEPS):
        train_step(step, use_amp=True, forward_ctx=bf16_autocast)
else:
    print(f"ONSET step {FP32_WARMUP_STEPS + 1}")
    with bf16_autocast():  # BUG: one autocast region around many optimizer steps
        for step in range(FP32_WARMUP_STEPS, TOTAL_STEPS):
            train_step(step, use_amp=True)

print("done")
