"""Training continues in eval mode after a mid-training validation pass.

Bug class: evaluation-mode leak (``model.eval()`` never undone).

Modelled on: shubhamagarwal92/mmd#14 "model.eval() in train.py" -- the
``evaluate`` helper calls ``model.eval()`` to disable dropout, but the training
loop never calls ``model.train()`` again, so once the first evaluation has run
all further training happens with dropout disabled and BatchNorm using (and no
longer updating) its running statistics.  The same mistake was reported in
tk-rusch/coRNN#1 "model.train() isn't called again after model.eval()".

What goes wrong: ``model.train()`` is called once before the epoch loop.  The
validation helper switches the model to eval mode after epoch 0 and nothing
switches it back, so from the first step of epoch 1 onwards the forward pass
uses running BatchNorm statistics instead of batch statistics, BN running stats
freeze and dropout is off.  Loss keeps going down (even faster: no dropout), so
nothing looks wrong.

Healthy twin: calls ``model.train()`` at the start of every epoch (the usual
fix), so training mode is restored after each validation.

Onset: validation runs after epoch 0 (10 optimizer steps, indices 0..9), so
the first optimizer step taken in the wrong mode is step 10.
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)
torch.manual_seed(0)

N_TRAIN, N_VAL, D, C = 320, 128, 20, 4
BATCH = 32
EPOCHS = 5


def make_data(n, gen):
    x = torch.randn(n, D, generator=gen)
    w = torch.linspace(-1, 1, D * C).reshape(D, C)
    logits = x @ w + 0.3 * torch.randn(n, C, generator=gen)
    return x, logits.argmax(1)


gen = torch.Generator().manual_seed(1234)
x_train, y_train = make_data(N_TRAIN, gen)
x_val, y_val = make_data(N_VAL, gen)

train_loader = DataLoader(TensorDataset(x_train, y_train), batch_size=BATCH, shuffle=True)
val_loader = DataLoader(TensorDataset(x_val, y_val), batch_size=64)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(D, 64)
        self.bn1 = nn.BatchNorm1d(64)
        self.drop = nn.Dropout(0.3)
        self.fc2 = nn.Linear(64, 64)
        self.bn2 = nn.BatchNorm1d(64)
        self.out = nn.Linear(64, C)

    def forward(self, x):
        x = self.drop(F.relu(self.bn1(self.fc1(x))))
        x = self.drop(F.relu(self.bn2(self.fc2(x))))
        return self.out(x)


model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def evaluate(model, loader):
    model.eval()
    correct, total, loss_sum = 0, 0, 0.0
    with torch.no_grad():
        for xb, yb in loader:
            out = model(xb)
            loss_sum += F.cross_entropy(out, yb, reduction="sum").item()
            correct += (out.argmax(1) == yb).sum().item()
            total += yb.numel()
    return loss_sum / total, correct / total


step = 0
model.train()
for epoch in range(EPOCHS):
    if HEALTHY:
        model.train()
    elif epoch == 1:
        # the model is still in eval mode from the validation pass below
        print(f"ONSET step {step}")
    for xb, yb in train_loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
        if step % 5 == 0:
            print(f"step {step:3d} train_loss {loss.item():.4f}")
        step += 1
    val_loss, val_acc = evaluate(model, val_loader)  # BUG: leaves the model in eval mode
    print(f"epoch {epoch} val_loss {val_loss:.4f} val_acc {val_acc:.3f}")

print("done")
