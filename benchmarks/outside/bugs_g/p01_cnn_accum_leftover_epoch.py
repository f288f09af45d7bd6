"""Small CNN classifier with hand-written gradient accumulation whose leftover micro-batches leak into the next epoch.

Bug class: gradient accumulation boundary / stale gradients carried across epochs.

Modelled on: rasbt/LLMs-from-scratch #299 and PR #300 "Improve gradient
accumulation" (the accumulation trigger was keyed on the batch index only, so it
was not triggered for the last batch of the loader), and the question in
Lightning-AI/pytorch-lightning #4653 "accumulate_grad_batches ignores last
batches in epoch if number of steps is not divisible by accumulate_grad_batches?".
A hand-written loop steps the optimizer when ``(i + 1) % ACCUM == 0`` and calls
``zero_grad()`` only right after that step.  When the number of micro-batches
per epoch is not a multiple of ACCUM, the gradients of the trailing micro-batches
are never applied in their epoch and are never cleared either.

What goes wrong: at the end of every epoch one micro-batch's gradient stays in
``.grad``; the first optimizer step of the next epoch then applies the sum of
ACCUM + 1 micro-batch gradients (one of them computed with the weights of the
previous epoch), and the last micro-batch of each epoch is never a step of its
own.  Loss still falls; nothing warns.

Healthy twin: also steps (and clears) on the last micro-batch of the epoch, as in
the PR's fix, so no gradient crosses an epoch boundary.

Onset: 360 samples / batch 8 = 45 micro-batches per epoch; ACCUM = 4 gives
11 optimizer steps (44 micro-batches) per epoch plus one leftover micro-batch.
Steps 0..10 of epoch 0 are clean; the first optimizer step of epoch 1, K = 11,
is the first one that applies the leaked gradient.  4 epochs: 44 steps in all
in the bug program.
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)
torch.manual_seed(0)

N, C, H = 360, 5, 16
BATCH = 8
ACCUM = 4
EPOCHS = 4


def make_images(n, gen):
    """Noisy images whose class sets the orientation/frequency of a stripe pattern."""
    y = torch.randint(0, C, (n,), generator=gen)
    xs = torch.linspace(-1, 1, H)
    yy, xx = torch.meshgrid(xs, xs, indexing="ij")
    angle = y.float()[:, None, None] * (3.1416 / C)
    phase = torch.rand(n, 1, 1, generator=gen) * 6.28
    proj = torch.cos(angle) * xx + torch.sin(angle) * yy
    img = torch.sin(4.0 * proj + phase) + 0.6 * torch.randn(n, H, H, generator=gen)
    return img.unsqueeze(1), y


class SmallConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(32 * 4 * 4, C))

    def forward(self, x):
        return self.classifier(self.features(x))


def main():
    gen = torch.Generator().manual_seed(3)
    x_train, y_train = make_images(N, gen)
    x_val, y_val = make_images(200, gen)
    loader = DataLoader(TensorDataset(x_train, y_train), batch_size=BATCH, shuffle=True,
                        generator=torch.Generator().manual_seed(11))

    model = SmallConvNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9, weight_decay=1e-4)

    step = 0
    onset_printed = False
    optimizer.zero_grad()
    for epoch in range(EPOCHS):
        model.train()
        n_batches = len(loader)
        running = 0.0
        for i, (xb, yb) in enumerate(loader):
            loss = F.cross_entropy(model(xb), yb) / ACCUM
            loss.backward()
            running += loss.item() * ACCUM
            boundary = (i + 1) % ACCUM == 0
            if HEALTHY:
                boundary = boundary or (i + 1) == n_batches
            if boundary:
                if not HEALTHY and epoch > 0 and not onset_printed:
                    # BUG: the leftover micro-batch of the previous epoch is still in .grad
                    print(f"ONSET step {step}")
                    onset_printed = True
                optimizer.step()
                optimizer.zero_grad()
                step += 1
        model.eval()
        with torch.no_grad():
            acc = (model(x_val).argmax(1) == y_val).float().mean().item()
        print(f"epoch {epoch} steps {step} train_loss {running / n_batches:.4f} val_acc {acc:.3f}")
    print("done")


if __name__ == "__main__":
    main()
