"""Small CNN classifier whose conv backbone is frozen partway, but SGD keeps moving it.

Bug class: frozen parameters still updated by the optimizer (momentum buffer and
weight decay applied to stale all-zero gradients).

Modelled on: facebookresearch/fairseq#4702 "Why parameters are still updated even
if I set their requires_grads equal to False?" and explosion/curated-transformers
PR #69 "Transformer: do not update when frozen" (frozen weights kept receiving
optimizer updates from all-zero gradients).  The loop follows the usual
hand-written image-classification recipe (pytorch/examples mnist/imagenet style):
conv stack + linear head, SGD(momentum=0.9, weight_decay=5e-4), a staged schedule
that freezes the feature extractor after a short warm-up and keeps training the
head.  The training loop zeroes gradients with ``zero_grad(set_to_none=False)``
(to keep grad buffers allocated), so when ``requires_grad`` is switched off the
backbone parameters still carry a ``.grad`` tensor full of zeros.

What goes wrong: ``torch.optim.SGD`` skips only parameters whose ``.grad`` is
None.  The frozen conv weights keep a zero gradient, so every step still applies
``buf = 0.9 * buf + wd * p`` and ``p -= lr * buf``: the "frozen" backbone keeps
drifting (first along its old momentum, then shrinking through weight decay)
while the head is trained against features that are still changing.  Loss keeps
going down; nothing warns.

Healthy twin: zeroes gradients with ``set_to_none=True`` (the default), so the
frozen parameters have ``grad is None`` and SGD leaves them untouched.

Onset: 384 images / batch 32 = 12 optimizer steps per epoch.  The backbone is
frozen at the start of epoch 1 (FREEZE_EPOCH), so the first step that moves a
frozen parameter is K = 1 * 12 = 12.  Training runs 5 epochs = 60 steps (48 buggy).
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

HEALTHY = "--healthy" in sys.argv

torch.set_num_threads(1)
torch.manual_seed(0)

N_IMAGES, N_CLASSES = 384, 5
BATCH = 32
EPOCHS = 5
FREEZE_EPOCH = 1


def make_images(n, gen):
    """Synthetic 3x16x16 images: class-specific blob position plus noise."""
    labels = torch.randint(0, N_CLASSES, (n,), generator=gen)
    yy, xx = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    centers = torch.tensor([[4.0, 4.0], [4.0, 11.0], [11.0, 4.0], [11.0, 11.0], [8.0, 8.0]])
    c = centers[labels]
    blob = torch.exp(-((yy - c[:, 0, None, None]) ** 2 + (xx - c[:, 1, None, None]) ** 2) / 6.0)
    colour = torch.rand(n, 3, 1, 1, generator=gen) + 0.5
    imgs = blob[:, None] * colour + 0.4 * torch.randn(n, 3, 16, 16, generator=gen)
    return imgs, labels


class SmallConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, N_CLASSES))

    def forward(self, x):
        return self.classifier(self.features(x))


def evaluate(model, x, y):
    model.eval()
    with torch.no_grad():
        acc = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    return acc


def main():
    gen = torch.Generator().manual_seed(3)
    x_train, y_train = make_images(N_IMAGES, gen)
    x_val, y_val = make_images(128, gen)
    loader = DataLoader(TensorDataset(x_train, y_train), batch_size=BATCH, shuffle=True,
                        generator=torch.Generator().manual_seed(1))

    model = SmallConvNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)

    step = 0
    for epoch in range(EPOCHS):
        if epoch == FREEZE_EPOCH:
            # stage 2: keep the learned feature extractor fixed, fine-tune the head only
            for p in model.features.parameters():
                p.requires_grad_(False)
            if not HEALTHY:
                print(f"ONSET step {step}")
        model.train()
        total = 0.0
        for xb, yb in loader:
            # BUG: set_to_none=False leaves zero .grad tensors on the frozen backbone,
            # so SGD still applies momentum and weight decay to it.
            optimizer.zero_grad(set_to_none=HEALTHY)
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            total += loss.item()
            step += 1
        print(f"epoch {epoch} step {step} train_loss {total / len(loader):.4f} "
              f"val_acc {evaluate(model, x_val, y_val):.3f}")
    print("done")


if __name__ == "__main__":
    main()
