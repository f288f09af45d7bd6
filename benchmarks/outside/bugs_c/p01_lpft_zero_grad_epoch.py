"""P01 (class: gradients never cleared -- optimizer.zero_grad() hoisted to the start of the epoch) -- plain loop.

Modelled on pytorch/pytorch#47175 "[feature request] Show warning if optimizer.zero_grad() was not called
before optimizer.step()", whose description names this exact silent bug: forgetting zero_grad() "or calling it
at the beginning of each epoch instead of the beginning of each iteration" (see also
tenstorrent/tt-blacksmith#711 "[Trainer] Fix Bug Where Zero Grad was Left Out" and meta-pytorch/torchforge#71
"[ez] zero grad every step").

The program is a two-stage LP-FT recipe (linear probe, then full fine-tune) for a small CNN on synthetic
class-template images.  Stage 1 (steps 0-11) trains only the head with a correct per-iteration loop.  Stage 2
(steps 12-35, 3 epochs of 8 steps) runs `finetune_one_epoch()`, in which `optimizer.zero_grad()` sits before the
batch loop.  Step 12 (the first of the epoch) still sees freshly zeroed grads; from step 13 on every SGD step
uses the running sum of all gradients since the epoch started.  Healthy twin: zero_grad() every iteration.
"""
import argparse
import math
import torch
import torch.nn as nn
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--healthy", action="store_true")
p.add_argument("--lp-steps", type=int, default=12)
p.add_argument("--ft-epochs", type=int, default=3)
p.add_argument("--steps-per-epoch", type=int, default=8)
p.add_argument("--batch-size", type=int, default=32)
args = p.parse_args()
HEALTHY = args.healthy

torch.manual_seed(0)
NUM_CLASSES = 6
gen = torch.Generator().manual_seed(1234)
templates = F.interpolate(torch.randn(NUM_CLASSES, 3, 4, 4, generator=gen), size=16, mode="bilinear",
                          align_corners=False)


def make_batch(bs, g):
    y = torch.randint(0, NUM_CLASSES, (bs,), generator=g)
    x = 1.5 * templates[y] + torch.randn(bs, 3, 16, 16, generator=g)
    return x, y


val_gen = torch.Generator().manual_seed(99)
val_set = [make_batch(64, val_gen) for _ in range(2)]


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )

    def forward(self, x):
        return self.features(x)


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = Backbone()
        self.head = nn.Linear(32, NUM_CLASSES)

    def forward(self, x):
        return self.head(self.backbone(x))


model = Classifier()
criterion = nn.CrossEntropyLoss(label_smoothing=0.05)


@torch.no_grad()
def evaluate():
    model.eval()
    correct = total = 0
    loss = 0.0
    for x, y in val_set:
        out = model(x)
        loss += F.cross_entropy(out, y, reduction="sum").item()
        correct += (out.argmax(1) == y).sum().item()
        total += y.numel()
    model.train()
    return loss / total, correct / total


global_step = 0
train_gen = torch.Generator().manual_seed(7)

# ---------------- stage 1: linear probe ----------------
for prm in model.backbone.parameters():
    prm.requires_grad_(False)
lp_opt = torch.optim.SGD(model.head.parameters(), lr=0.05, momentum=0.9)
model.train()
model.backbone.eval()  # frozen backbone: keep BN statistics fixed during linear probing
for it in range(args.lp_steps):
    x, y = make_batch(args.batch_size, train_gen)
    lp_opt.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    lp_opt.step()
    if it % 4 == 0:
        print(f"[LP] step {global_step} loss {loss.item():.4f}")
    global_step += 1
vl, va = evaluate()
print(f"[LP] done: val_loss {vl:.4f} val_acc {va:.3f}")

# ---------------- stage 2: full fine-tune ----------------
for prm in model.backbone.parameters():
    prm.requires_grad_(True)
model.train()
optimizer = torch.optim.SGD(
    [{"params": model.backbone.parameters(), "lr": 0.03},
     {"params": model.head.parameters(), "lr": 0.05}],
    momentum=0.9, weight_decay=1e-4)
total_ft = args.ft_epochs * args.steps_per_epoch
scheduler = torch.optim.lr_scheduler.LambdaLR(
    optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * s / total_ft)))


def finetune_one_epoch(epoch):
    global global_step
    model.train()
    running = 0.0
    if not HEALTHY:
        optimizer.zero_grad()  # BUG: once per epoch instead of once per iteration
    for it in range(args.steps_per_epoch):
        x, y = make_batch(args.batch_size, train_gen)
        if HEALTHY:
            optimizer.zero_grad()
        elif it == 1 and epoch == 0:
            print(f"ONSET step {global_step}")  # first step whose .grad holds more than its own gradient
        out = model(x)
        loss = criterion(out, y)
        loss.backward()
        optimizer.step()
        scheduler.step()
        running += loss.item()
        if global_step % 4 == 0:
            gn = torch.sqrt(sum((q.grad ** 2).sum() for q in model.parameters() if q.grad is not None))
            print(f"[FT] epoch {epoch} step {global_step} loss {loss.item():.4f} grad_norm {gn.item():.3f} "
                  f"lr {scheduler.get_last_lr()[0]:.5f}")
        global_step += 1
    return running / args.steps_per_epoch


best = float("inf")
for epoch in range(args.ft_epochs):
    tl = finetune_one_epoch(epoch)
    vl, va = evaluate()
    print(f"[FT] epoch {epoch} train_loss {tl:.4f} val_loss {vl:.4f} val_acc {va:.3f}")
    if vl < best:
        best = vl
        torch.save({"model": model.state_dict(), "epoch": epoch}, "p01_best.pt")
print(f"finished {global_step} optimizer steps, best val_loss {best:.4f}")
