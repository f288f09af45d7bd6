"""Gradient accumulation without dividing the loss by the number of micro-batches.

Bug class: gradient handling (accumulated gradient is a sum, not a mean).

Modelled on: fastai/fastai#3023 "Gradient Accumulation causes lower lr to be
same as non-gradient accumulation" -- the accumulating callback did not scale
the loss by the number of accumulated batches, so the accumulated gradient was
N times too large and the effective learning rate was multiplied by N (see also
karpathy/nanoGPT's ``loss = loss / gradient_accumulation_steps`` and
ApolloResearch/e2e_sae#70 "Divide loss by grad accumulation steps").

Setup: a batch-size ramp, as used in large-model recipes: the first
``RAMP_STEP`` optimizer steps use one micro-batch each, afterwards every
optimizer step accumulates ``ACCUM_STEPS`` micro-batches to get a 4x larger
effective batch at the same learning rate.

What goes wrong: when accumulation kicks in, each micro-batch loss is
back-propagated unscaled, so the gradient handed to SGD is the *sum* of 4
micro-batch mean gradients.  With SGD+momentum this is a silent 4x learning
rate jump exactly when the user intended to reduce gradient noise; the loss
becomes noisier / plateaus higher but nothing diverges or errors.

Healthy twin: divides each micro-batch loss by ``ACCUM_STEPS`` before
``backward()`` so the accumulated gradient is the mean over the effective batch.

Onset: the first optimizer step that uses accumulation is step 16, so K = 16.
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)
torch.manual_seed(0)

D, HIDDEN = 24, 96
MICRO_BATCH = 16
TOTAL_STEPS = 45
RAMP_STEP = 16
ACCUM_STEPS = 4
LR = 0.03

w_true = torch.randn(D, 1)


def micro_batch():
    x = torch.randn(MICRO_BATCH, D)
    y = 2 * torch.tanh(x @ w_true / 5) + 0.1 * torch.randn(MICRO_BATCH, 1)
    return x, y


model = nn.Sequential(nn.Linear(D, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                      nn.Linear(HIDDEN, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)

for step in range(TOTAL_STEPS):
    accum = 1 if step < RAMP_STEP else ACCUM_STEPS
    if step == RAMP_STEP:
        print(f"switching to gradient accumulation x{ACCUM_STEPS} "
              f"(effective batch {MICRO_BATCH * ACCUM_STEPS})")
        if not HEALTHY:
            print(f"ONSET step {step}")
    optimizer.zero_grad()
    running = 0.0
    for micro in range(accum):
        x, y = micro_batch()
        loss = F.mse_loss(model(x), y)
        running += loss.item() / accum
        if HEALTHY:
            loss = loss / accum
        loss.backward()  # BUG: micro-batch losses are summed, not averaged, when accum > 1
    optimizer.step()
    if step % 4 == 0 or step == TOTAL_STEPS - 1:
        print(f"step {step:3d} accum {accum} loss {running:.4f}")

print("done")
