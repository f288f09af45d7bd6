"""Auxiliary regression loss silently broadcasts (B, 1) against (B,) to (B, B).

Bug class: loss computation (shape broadcasting in a hand-written loss).

Modelled on: pytorch/pytorch#16045 "Bug: fail to throw error when computing loss
between tensors with shapes [n, 1] and [n]" (also pytorch/pytorch#19699
"Different loss value based on shape").  A regression head returns ``(B, 1)``
while the target is ``(B,)``; the subtraction broadcasts to a ``(B, B)``
matrix, so the "MSE" compares every prediction with every target.  The loss is
finite and even decreases a bit (it pushes all predictions towards the batch
mean of the targets), so training looks fine -- but the regression head never
learns the per-sample target and its gradient pollutes the shared trunk.  Here
the squared error is written by hand, so not even ``MSELoss``'s size warning
is printed.

Setup: a two-headed model (classification + auxiliary regression).  As is
common for multi-task training, the auxiliary loss is switched on only after
``AUX_START_STEP`` steps of pure classification training.

Healthy twin: squeezes the regression output to ``(B,)`` before taking the
squared error, so the auxiliary loss is the intended per-sample MSE.

Onset: the auxiliary loss (and with it the bug) first contributes to the
gradient at optimizer step 15, so K = 15.
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)
torch.manual_seed(0)

N, D, C = 640, 16, 5
BATCH = 32
EPOCHS = 3
AUX_START_STEP = 15
AUX_WEIGHT = 0.5

gen = torch.Generator().manual_seed(7)
x = torch.randn(N, D, generator=gen)
w_cls = torch.randn(D, C, generator=gen)
w_reg = torch.randn(D, generator=gen)
y_cls = (x @ w_cls).argmax(1)
y_reg = torch.tanh(x @ w_reg / 4) * 3 + 0.1 * torch.randn(N, generator=gen)   # shape (N,)

loader = DataLoader(TensorDataset(x, y_cls, y_reg), batch_size=BATCH, shuffle=True)


class MultiTaskNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(D, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.cls_head = nn.Linear(64, C)
        self.reg_head = nn.Linear(64, 1)

    def forward(self, x):
        h = self.trunk(x)
        return self.cls_head(h), self.reg_head(h)


model = MultiTaskNet()
optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)

step = 0
for epoch in range(EPOCHS):
    for xb, yb_cls, yb_reg in loader:
        logits, reg_pred = model(xb)
        cls_loss = F.cross_entropy(logits, yb_cls)
        loss = cls_loss
        aux_loss = torch.zeros(())
        if step >= AUX_START_STEP:
            if step == AUX_START_STEP and not HEALTHY:
                print(f"ONSET step {step}")
            if HEALTHY:
                reg_pred = reg_pred.squeeze(-1)
            aux_loss = ((reg_pred - yb_reg) ** 2).mean()  # BUG: (B,1) - (B,) broadcasts to (B,B)
            loss = loss + AUX_WEIGHT * aux_loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 5 == 0:
            print(f"step {step:3d} loss {loss.item():.4f} cls {cls_loss.item():.4f} aux {aux_loss.item():.4f}")
        step += 1

print("done")
