"""Modelled on the pytorch/examples imagenet/main.py training script (save_checkpoint /
--resume with model+optimizer+scheduler state, best-checkpoint tracking) combined with the
"Automatic Mixed Precision" recipe (torch.autocast + GradScaler) and the
CosineAnnealingWarmRestarts per-iteration stepping shown in its docstring.

Exercises: float32 warm-up epoch followed by mixed precision switched on mid-run (autocast +
GradScaler, state saved in the checkpoint); a masked (partially labelled) loss that is
non-finite when a batch has no labelled samples, in which case the step is skipped;
training interrupted after two epochs and resumed in fresh objects from the checkpoint
(model + optimizer + scheduler + scaler + epoch); the best checkpoint reloaded at the end for
a short low-LR fine-tuning phase with a *new* optimizer and BatchNorm frozen in eval mode;
evaluation with horizontal-flip test-time augmentation.
"""
import math
import os
import shutil
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
torch.manual_seed(0)
device_type = "cpu"
amp_dtype = torch.bfloat16 if device_type == "cpu" else torch.float16


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNetTiny(nn.Module):
    def __init__(self, num_classes=4):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.layer1 = BasicBlock(16, 16)
        self.layer2 = BasicBlock(16, 32, stride=2)
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x):
        x = self.layer2(self.layer1(self.stem(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def make_data(n, gen):
    y = torch.randint(0, 4, (n,), generator=gen)
    x = 0.5 * torch.randn(n, 3, 16, 16, generator=gen)
    for c in range(4):  # class = location of a bright quadrant (left/right symmetric pairs)
        r = (c // 2) * 8
        x[y == c, c % 3, r:r + 8, :] += 2.0
    labelled = torch.rand(n, generator=gen) < 0.3  # semi-supervised: ~30% labelled
    return torch.utils.data.TensorDataset(x, y, labelled.float())


gen = torch.Generator().manual_seed(0)
train_set, val_set = make_data(96, gen), make_data(128, gen)
train_loader = torch.utils.data.DataLoader(train_set, batch_size=8, shuffle=True,
                                           generator=torch.Generator().manual_seed(1))
val_loader = torch.utils.data.DataLoader(val_set, batch_size=64)
iters = len(train_loader)
ckpt_dir = "ckpt_resnet_amp_resume"
os.makedirs(ckpt_dir, exist_ok=True)


def save_checkpoint(state, is_best, filename=os.path.join(ckpt_dir, "checkpoint.pth.tar")):
    torch.save(state, filename)
    if is_best:
        shutil.copyfile(filename, os.path.join(ckpt_dir, "model_best.pth.tar"))


@torch.no_grad()
def validate(model, tta=False):
    model.eval()
    correct = 0
    for x, y, _ in val_loader:
        logits = model(x).softmax(-1)
        if tta:
            logits = 0.5 * (logits + model(torch.flip(x, dims=[3])).softmax(-1))
        correct += (logits.argmax(-1) == y).sum().item()
    return 100.0 * correct / len(val_set)


def build():
    model = ResNetTiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(optimizer, T_0=1, T_mult=2, eta_min=1e-4)
    scaler = torch.amp.GradScaler(device_type, enabled=(amp_dtype == torch.float16))
    return model, optimizer, scheduler, scaler


def train_one_epoch(epoch, model, optimizer, scheduler, scaler, use_amp):
    model.train()
    skipped, last = 0, float("nan")
    for i, (x, y, mask) in enumerate(train_loader):
        with torch.autocast(device_type, dtype=amp_dtype, enabled=use_amp):
            logits = model(x)
        per_sample = F.cross_entropy(logits.float(), y, reduction="none")
        loss = (per_sample * mask).sum() / mask.sum()  # NaN (0/0) if the batch has no labels
        if not math.isfinite(loss.item()):
            print(f"epoch {epoch} iter {i}: non-finite loss ({loss.item()}), skipping step")
            optimizer.zero_grad(set_to_none=True)
            skipped += 1
            continue
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        scheduler.step(epoch + i / iters)
        last = loss.item()
    print(f"epoch {epoch} (amp={use_amp}) last loss {last:.4f} lr {optimizer.param_groups[0]['lr']:.5f} skipped {skipped}")


warmup_epochs, interrupt_after, epochs = 1, 2, 3
best_acc1 = 0.0

# ---- first run: gets interrupted after `interrupt_after` epochs ----
model, optimizer, scheduler, scaler = build()
for epoch in range(0, interrupt_after):
    train_one_epoch(epoch, model, optimizer, scheduler, scaler, use_amp=epoch >= warmup_epochs)
    acc1 = validate(model)
    is_best = acc1 > best_acc1
    best_acc1 = max(acc1, best_acc1)
    save_checkpoint({"epoch": epoch + 1, "state_dict": model.state_dict(), "best_acc1": best_acc1,
                     "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                     "scaler": scaler.state_dict()}, is_best)
    print(f"  val acc {acc1:.1f} (best {best_acc1:.1f})")
del model, optimizer, scheduler, scaler

# ---- second run: --resume checkpoint.pth.tar ----
model, optimizer, scheduler, scaler = build()
checkpoint = torch.load(os.path.join(ckpt_dir, "checkpoint.pth.tar"), map_location="cpu")
start_epoch, best_acc1 = checkpoint["epoch"], checkpoint["best_acc1"]
model.load_state_dict(checkpoint["state_dict"])
optimizer.load_state_dict(checkpoint["optimizer"])
scheduler.load_state_dict(checkpoint["scheduler"])
scaler.load_state_dict(checkpoint["scaler"])
print(f"=> loaded checkpoint (epoch {checkpoint['epoch']})")
for epoch in range(start_epoch, epochs):
    train_one_epoch(epoch, model, optimizer, scheduler, scaler, use_amp=epoch >= warmup_epochs)
    acc1 = validate(model)
    is_best = acc1 > best_acc1
    best_acc1 = max(acc1, best_acc1)
    save_checkpoint({"epoch": epoch + 1, "state_dict": model.state_dict(), "best_acc1": best_acc1,
                     "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                     "scaler": scaler.state_dict()}, is_best)
    print(f"  val acc {acc1:.1f} (best {best_acc1:.1f})")

# ---- final phase: reload best weights, fine-tune with a fresh optimizer, BN frozen ----
best = torch.load(os.path.join(ckpt_dir, "model_best.pth.tar"), map_location="cpu")
model.load_state_dict(best["state_dict"])
ft_optimizer = torch.optim.SGD([p for n, p in model.named_parameters() if "bn" not in n and "shortcut.1" not in n
                                and "stem.1" not in n], lr=2e-3, momentum=0.9)
for m in model.modules():
    if isinstance(m, nn.BatchNorm2d):
        m.weight.requires_grad_(False)
        m.bias.requires_grad_(False)
for step, (x, y, mask) in enumerate(train_loader):
    model.train()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.eval()  # keep running statistics fixed while fine-tuning
    if mask.sum() == 0:
        continue
    loss = (F.cross_entropy(model(x), y, reduction="none") * mask).sum() / mask.sum()
    ft_optimizer.zero_grad()
    loss.backward()
    ft_optimizer.step()
    if step == 7:
        break
print(f"after fine-tune: val acc {validate(model):.1f}  with flip-TTA {validate(model, tta=True):.1f}")
