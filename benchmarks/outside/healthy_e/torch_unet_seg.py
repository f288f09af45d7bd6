"""Small U-Net for binary semantic segmentation with bf16 autocast, gradient accumulation and checkpoint/resume.

Modelled on milesial/Pytorch-UNet (``train.py``, ``unet/unet_parts.py``,
``utils/dice_score.py``): ``DoubleConv``/``Down``/``Up`` blocks with skip
connections, cross-entropy + multiclass Dice loss, evaluation with the Dice
coefficient under ``model.eval()``/``torch.no_grad()``, a ``ReduceLROnPlateau``
scheduler stepped on the validation Dice score, ``torch.autocast`` mixed
precision (here ``torch.autocast("cpu", dtype=torch.bfloat16)``; bf16 needs no
GradScaler) and per-epoch checkpoints.

Additions, as commonly written on top of that script: gradient accumulation
over 2 micro-batches (loss divided by the accumulation count) and a genuine
mid-run resume: after epoch 3 the run saves model, optimizer, scheduler, epoch
counter and RNG state, throws every object away, rebuilds them and loads the
checkpoint before continuing with epochs 4-6.  Data are synthetic 32x32 images
of noisy discs and squares.  6 epochs x 6 optimizer steps = 36 steps.
"""
import argparse
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true", help="ignored")
parser.add_argument("--epochs", type=int, default=6)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--accum", type=int, default=2)
parser.add_argument("--lr", type=float, default=3e-3)
args = parser.parse_args()

torch.set_num_threads(1)
torch.manual_seed(0)


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.arange(32.0), torch.arange(32.0), indexing="ij")
    masks = torch.zeros(n, 32, 32, dtype=torch.long)
    for i in range(n):
        cy, cx = (torch.rand(2, generator=g) * 16 + 8).tolist()
        r = float(torch.rand(1, generator=g) * 5 + 4)
        if i % 2 == 0:
            m = (yy - cy) ** 2 + (xx - cx) ** 2 < r ** 2
        else:
            m = ((yy - cy).abs() < r) & ((xx - cx).abs() < r)
        masks[i] = m.long()
    imgs = masks.float().unsqueeze(1) * 0.8 + torch.randn(n, 1, 32, 32, generator=g) * 0.5
    return TensorDataset(imgs, masks)


class DoubleConv(nn.Module):
    """(convolution => [BN] => ReLU) * 2"""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.double_conv = nn.Sequential(
            nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels), nn.ReLU(inplace=True),
            nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels), nn.ReLU(inplace=True),
        )

    def forward(self, x):
        return self.double_conv(x)


class Down(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.maxpool_conv = nn.Sequential(nn.MaxPool2d(2), DoubleConv(in_channels, out_channels))

    def forward(self, x):
        return self.maxpool_conv(x)


class Up(nn.Module):
    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.up = nn.ConvTranspose2d(in_channels, in_channels // 2, kernel_size=2, stride=2)
        self.conv = DoubleConv(in_channels, out_channels)

    def forward(self, x1, x2):
        x1 = self.up(x1)
        return self.conv(torch.cat([x2, x1], dim=1))


class UNet(nn.Module):
    def __init__(self, n_channels=1, n_classes=2, base=8):
        super().__init__()
        self.n_classes = n_classes
        self.inc = DoubleConv(n_channels, base)
        self.down1 = Down(base, base * 2)
        self.down2 = Down(base * 2, base * 4)
        self.up1 = Up(base * 4, base * 2)
        self.up2 = Up(base * 2, base)
        self.outc = nn.Conv2d(base, n_classes, kernel_size=1)

    def forward(self, x):
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        x = self.up1(x3, x2)
        x = self.up2(x, x1)
        return self.outc(x)


def dice_coeff(input, target, epsilon=1e-6):
    # average of Dice coefficient over the batch, inputs of shape (B, H, W)
    inter = 2 * (input * target).sum(dim=(-1, -2))
    sets_sum = input.sum(dim=(-1, -2)) + target.sum(dim=(-1, -2))
    sets_sum = torch.where(sets_sum == 0, inter, sets_sum)
    return ((inter + epsilon) / (sets_sum + epsilon)).mean()


def multiclass_dice_coeff(input, target):
    return dice_coeff(input.flatten(0, 1), target.flatten(0, 1))


def dice_loss(input, target):
    return 1 - multiclass_dice_coeff(input, target)


@torch.no_grad()
def evaluate(net, loader):
    net.eval()
    dice_score = 0.0
    for image, mask_true in loader:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mask_pred = net(image)
        mask_true = F.one_hot(mask_true, net.n_classes).permute(0, 3, 1, 2).float()
        mask_pred = F.one_hot(mask_pred.argmax(dim=1), net.n_classes).permute(0, 3, 1, 2).float()
        # compute the Dice score, ignoring background
        dice_score += multiclass_dice_coeff(mask_pred[:, 1:], mask_true[:, 1:]).item()
    net.train()
    return dice_score / max(len(loader), 1)


def build():
    model = UNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, "max", patience=1, factor=0.5)
    return model, optimizer, scheduler


def train_epochs(model, optimizer, scheduler, start_epoch, end_epoch, global_step):
    criterion = nn.CrossEntropyLoss()
    for epoch in range(start_epoch, end_epoch + 1):
        model.train()
        epoch_loss = 0.0
        optimizer.zero_grad(set_to_none=True)
        for i, (images, true_masks) in enumerate(train_loader):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                masks_pred = model(images)
                loss = criterion(masks_pred, true_masks)
                loss = loss + dice_loss(
                    F.softmax(masks_pred, dim=1).float(),
                    F.one_hot(true_masks, model.n_classes).permute(0, 3, 1, 2).float(),
                )
            (loss / args.accum).backward()
            epoch_loss += loss.item()
            if (i + 1) % args.accum == 0 or (i + 1) == len(train_loader):
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                global_step += 1
        val_score = evaluate(model, val_loader)
        scheduler.step(val_score)
        print(f"epoch {epoch} step {global_step} train_loss {epoch_loss / len(train_loader):.4f} "
              f"val_dice {val_score:.4f} lr {optimizer.param_groups[0]['lr']:.2e}")
    return global_step


train_loader = DataLoader(make_data(96, seed=1), batch_size=args.batch_size, shuffle=True,
                          generator=torch.Generator().manual_seed(0))
val_loader = DataLoader(make_data(32, seed=2), batch_size=16, shuffle=False)

ckpt_dir = tempfile.TemporaryDirectory()
resume_after = args.epochs // 2
ckpt_path = os.path.join(ckpt_dir.name, f"checkpoint_epoch{resume_after}.pth")

# ---- first part of the run
model, optimizer, scheduler = build()
print(f"val_dice before training {evaluate(model, val_loader):.4f}")
global_step = train_epochs(model, optimizer, scheduler, 1, resume_after, 0)
torch.save({
    "epoch": resume_after,
    "global_step": global_step,
    "model_state_dict": model.state_dict(),
    "optimizer_state_dict": optimizer.state_dict(),
    "scheduler_state_dict": scheduler.state_dict(),
    "torch_rng_state": torch.get_rng_state(),
    "loader_rng_state": train_loader.generator.get_state(),
}, ckpt_path)
print(f"checkpoint saved to {os.path.basename(ckpt_path)}")
del model, optimizer, scheduler

# ---- resume: fresh objects, restore everything from the checkpoint
model, optimizer, scheduler = build()
ckpt = torch.load(ckpt_path, weights_only=False)
model.load_state_dict(ckpt["model_state_dict"])
optimizer.load_state_dict(ckpt["optimizer_state_dict"])
scheduler.load_state_dict(ckpt["scheduler_state_dict"])
torch.set_rng_state(ckpt["torch_rng_state"])
train_loader.generator.set_state(ckpt["loader_rng_state"])
print(f"resumed from epoch {ckpt['epoch']} (step {ckpt['global_step']}), "
      f"val_dice {evaluate(model, val_loader):.4f}")
global_step = train_epochs(model, optimizer, scheduler, ckpt["epoch"] + 1, args.epochs, ckpt["global_step"])
print(f"finished after {global_step} optimizer steps")
ckpt_dir.cleanup()
