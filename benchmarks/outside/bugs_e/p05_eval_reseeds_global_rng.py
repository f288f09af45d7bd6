"""Periodic evaluation re-seeds the *global* RNG, so every epoch replays the same randomness.

Bug class: RNG / seeding (global generator reset inside the training loop).

Modelled on: huggingface/diffusers#175 "Is the use of `torch.manual_seed` in
example training code correct?" -- the example training script created the
sampling generator for its periodic evaluation with
``generator = torch.manual_seed(0)``.  ``torch.manual_seed`` does not create a
new generator: it re-seeds and returns the *global* default generator, so each
evaluation silently resets all training randomness (a user noticed the shuffled
DataLoader "produced the same mini batches in the same order").  See also
pytorch/pytorch#80119 "The use of validation dataloader changes the train
dataloader".

What goes wrong: after the first evaluation every epoch starts from the same
global RNG state, so every epoch sees the identical shuffling order, identical
dropout masks and identical noise augmentation -- the model effectively trains
on one fixed epoch repeated, losing the regularising randomness.  No error, loss
still decreases (often faster, because it memorises the replayed noise).

Healthy twin: uses a private ``torch.Generator().manual_seed(0)`` for the fixed
evaluation noise, leaving the global RNG stream untouched.

Onset: evaluation runs after epoch 0 (12 optimizer steps, indices 0..11); the
first optimizer step that runs with the reset RNG state is step 12.
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)
torch.manual_seed(1)

N_TRAIN, N_VAL, D, C = 384, 128, 32, 6
BATCH = 32
EPOCHS = 4
NOISE_STD = 0.3

data_gen = torch.Generator().manual_seed(99)
protos = torch.randn(C, D, generator=data_gen)


def make_split(n):
    y = torch.randint(0, C, (n,), generator=data_gen)
    x = protos[y] + 2.5 * torch.randn(n, D, generator=data_gen)
    return x, y


x_tr, y_tr = make_split(N_TRAIN)
x_va, y_va = make_split(N_VAL)
train_loader = DataLoader(TensorDataset(x_tr, y_tr), batch_size=BATCH, shuffle=True)

model = nn.Sequential(nn.Linear(D, 128), nn.ReLU(), nn.Dropout(0.2),
                      nn.Linear(128, 128), nn.ReLU(), nn.Dropout(0.2),
                      nn.Linear(128, C))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)


def evaluate():
    """Accuracy on clean and on (fixed) noisy validation inputs."""
    model.eval()
    if HEALTHY:
        generator = torch.Generator().manual_seed(0)
    else:
        generator = torch.manual_seed(0)  # BUG: re-seeds and returns the global default generator
    with torch.no_grad():
        noise = NOISE_STD * torch.randn(x_va.shape, generator=generator)
        clean = (model(x_va).argmax(1) == y_va).float().mean().item()
        noisy = (model(x_va + noise).argmax(1) == y_va).float().mean().item()
    model.train()
    return clean, noisy


step = 0
for epoch in range(EPOCHS):
    if epoch == 1 and not HEALTHY:
        print(f"ONSET step {step}")
    model.train()
    for xb, yb in train_loader:
        xb = xb + NOISE_STD * torch.randn_like(xb)  # noise augmentation
        loss = F.cross_entropy(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 6 == 0:
            print(f"step {step:3d} loss {loss.item():.4f}")
        step += 1
    clean, noisy = evaluate()
    print(f"epoch {epoch} val_acc {clean:.3f} val_acc_noisy {noisy:.3f}")

print("done")
