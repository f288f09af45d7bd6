"""A small U-Net for binary-plus-background segmentation of synthetic images with random disc masks.

Modelled on: milesial/Pytorch-UNet (https://github.com/milesial/Pytorch-UNet, train.py,
evaluate.py, unet/unet_parts.py, utils/dice_score.py)
Habits reproduced: DoubleConv/Down/Up/OutConv parts with bilinear upsampling and padding to
match skip connections, RMSprop (``weight_decay``, ``momentum``, ``foreach=True``),
``ReduceLROnPlateau('max')`` stepped on the validation Dice score, cross entropy plus a
multiclass Dice loss on softmax outputs, ``torch.autocast`` and a ``GradScaler`` created with
``enabled=amp``, ``optimizer.zero_grad(set_to_none=True)`` before the backward, unscale then
``clip_grad_norm_``, validation every ``division_step`` batches in an ``evaluate()`` decorated
with ``@torch.inference_mode()`` that puts the net back in train mode, and a per-epoch checkpoint
of the state dict carrying the mask values.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import optim
from torch.utils.data import DataLoader, Dataset, random_split


class DoubleConv(nn.Module):
    """(convolution => [BN] => ReLU) * 2"""

    def __init__(self, in_channels, out_channels, mid_channels=None):
        super().__init__()
        if not mid_channels:
            mid_channels = out_channels
        self.double_conv = nn.Sequential(
            nn.Conv2d(in_channels, mid_channels, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(mid_channels),
            nn.ReLU(inplace=True),
            nn.Conv2d(mid_channels, out_channels, kernel_size=3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True),
        )

    def forward(self, x):
        return self.double_conv(x)


class Down(nn.Module):
    """Downscaling with maxpool then double conv"""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.maxpool_conv = nn.Sequential(nn.MaxPool2d(2), DoubleConv(in_channels, out_channels))

    def forward(self, x):
        return self.maxpool_conv(x)


class Up(nn.Module):
    """Upscaling then double conv"""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
        self.conv = DoubleConv(in_channels, out_channels, in_channels // 2)

    def forward(self, x1, x2):
        x1 = self.up(x1)
        diffY = x2.size()[2] - x1.size()[2]
        diffX = x2.size()[3] - x1.size()[3]
        x1 = F.pad(x1, [diffX // 2, diffX - diffX // 2, diffY // 2, diffY - diffY // 2])
        x = torch.cat([x2, x1], dim=1)
        return self.conv(x)


class OutConv(nn.Module):
    def __init__(self, in_channels, out_channels):
        super(OutConv, self).__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=1)

    def forward(self, x):
        return self.conv(x)


class UNet(nn.Module):
    def __init__(self, n_channels, n_classes, base=8):
        super(UNet, self).__init__()
        self.n_channels = n_channels
        self.n_classes = n_classes
        self.inc = DoubleConv(n_channels, base)
        self.down1 = Down(base, base * 2)
        self.down2 = Down(base * 2, base * 4 // 2)
        self.up1 = Up(base * 4, base)
        self.up2 = Up(base * 2, base)
        self.outc = OutConv(base, n_classes)

    def forward(self, x):
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        x = self.up1(x3, x2)
        x = self.up2(x, x1)
        return self.outc(x)


def dice_coeff(input, target, reduce_batch_first=False, epsilon=1e-6):
    sum_dim = (-1, -2) if input.dim() == 2 or not reduce_batch_first else (-1, -2, -3)
    inter = 2 * (input * target).sum(dim=sum_dim)
    sets_sum = input.sum(dim=sum_dim) + target.sum(dim=sum_dim)
    sets_sum = torch.where(sets_sum == 0, inter, sets_sum)
    dice = (inter + epsilon) / (sets_sum + epsilon)
    return dice.mean()


def multiclass_dice_coeff(input, target, reduce_batch_first=False, epsilon=1e-6):
    return dice_coeff(input.flatten(0, 1), target.flatten(0, 1), reduce_batch_first, epsilon)


def dice_loss(input, target, multiclass=False):
    fn = multiclass_dice_coeff if multiclass else dice_coeff
    return 1 - fn(input, target, reduce_batch_first=True)


class DiscDataset(Dataset):
    """Noisy images of bright discs; the mask labels disc pixels 1 and background 0."""

    mask_values = [0, 1]

    def __init__(self, n, size, seed):
        generator = torch.Generator().manual_seed(seed)
        ys = torch.arange(size).view(1, size, 1).float()
        xs = torch.arange(size).view(1, 1, size).float()
        centres = torch.rand(n, 2, 1, 1, generator=generator) * size
        radii = 2 + torch.rand(n, 1, 1, generator=generator) * size / 4
        inside = (ys - centres[:, 0]) ** 2 + (xs - centres[:, 1]) ** 2 < radii ** 2
        self.masks = inside.long()
        self.images = (inside.float().unsqueeze(1) * 0.6 + 0.4 * torch.rand(n, 3, size, size, generator=generator))

    def __len__(self):
        return len(self.masks)

    def __getitem__(self, idx):
        return {"image": self.images[idx].contiguous(), "mask": self.masks[idx].contiguous()}


@torch.inference_mode()
def evaluate(net, dataloader, device, amp):
    net.eval()
    num_val_batches = len(dataloader)
    dice_score = 0

    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
        for batch in dataloader:
            image, mask_true = batch["image"], batch["mask"]
            image = image.to(device=device, dtype=torch.float32)
            mask_true = mask_true.to(device=device, dtype=torch.long)

            mask_pred = net(image)
            mask_true = F.one_hot(mask_true, net.n_classes).permute(0, 3, 1, 2).float()
            mask_pred = F.one_hot(mask_pred.argmax(dim=1), net.n_classes).permute(0, 3, 1, 2).float()
            # compute the Dice score, ignoring background
            dice_score += multiclass_dice_coeff(mask_pred[:, 1:], mask_true[:, 1:], reduce_batch_first=False)

    net.train()
    return dice_score / max(num_val_batches, 1)


def train_model(model, device, args):
    dataset = DiscDataset(args.batch_size * (args.epoch_steps + 1), 16, args.seed)
    n_val = args.batch_size
    n_train = len(dataset) - n_val
    train_set, val_set = random_split(dataset, [n_train, n_val], generator=torch.Generator().manual_seed(args.seed))

    loader_args = dict(batch_size=args.batch_size, num_workers=0)
    train_loader = DataLoader(train_set, shuffle=True, **loader_args)
    val_loader = DataLoader(val_set, shuffle=False, drop_last=True, **loader_args)

    optimizer = optim.RMSprop(model.parameters(), lr=args.lr, weight_decay=1e-8, momentum=0.999, foreach=True)
    scheduler = optim.lr_scheduler.ReduceLROnPlateau(optimizer, "max", patience=2)  # goal: maximize Dice score
    grad_scaler = torch.amp.GradScaler("cpu", enabled=args.amp)
    criterion = nn.CrossEntropyLoss() if model.n_classes > 1 else nn.BCEWithLogitsLoss()
    global_step = 0
    dir_checkpoint = tempfile.TemporaryDirectory()

    epoch = 1
    while global_step < args.steps:
        model.train()
        epoch_loss = 0
        for batch in train_loader:
            if global_step >= args.steps:
                break
            images, true_masks = batch["image"], batch["mask"]
            assert images.shape[1] == model.n_channels

            images = images.to(device=device, dtype=torch.float32, memory_format=torch.channels_last)
            true_masks = true_masks.to(device=device, dtype=torch.long)

            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp):
                masks_pred = model(images)
                loss = criterion(masks_pred, true_masks)
                loss += dice_loss(
                    F.softmax(masks_pred, dim=1).float(),
                    F.one_hot(true_masks, model.n_classes).permute(0, 3, 1, 2).float(),
                    multiclass=True,
                )

            optimizer.zero_grad(set_to_none=True)
            grad_scaler.scale(loss).backward()
            grad_scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.gradient_clipping)
            grad_scaler.step(optimizer)
            grad_scaler.update()

            global_step += 1
            epoch_loss += loss.item()
            print(f"epoch {epoch} step {global_step} train loss {loss.item():.4f}")

            # Evaluation round
            division_step = args.val_every
            if division_step > 0 and global_step % division_step == 0:
                val_score = evaluate(model, val_loader, device, args.amp)
                scheduler.step(val_score)
                print(f"Validation Dice score: {float(val_score):.4f} lr {optimizer.param_groups[0]['lr']:.2e}")

        state_dict = model.state_dict()
        state_dict["mask_values"] = dataset.mask_values
        torch.save(state_dict, os.path.join(dir_checkpoint.name, "checkpoint_epoch{}.pth".format(epoch)))
        print(f"Checkpoint {epoch} saved! epoch loss {epoch_loss:.4f}")
        epoch += 1
    dir_checkpoint.cleanup()


def main():
    parser = argparse.ArgumentParser(description="Train the UNet on synthetic images and target masks")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps in total")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", "-b", dest="batch_size", type=int, default=4)
    parser.add_argument("--epoch-steps", type=int, default=4, help="batches per epoch")
    parser.add_argument("--learning-rate", "-l", dest="lr", type=float, default=1e-4)
    parser.add_argument("--amp", action="store_true", default=False, help="bf16 mixed precision")
    parser.add_argument("--gradient-clipping", type=float, default=1.0)
    parser.add_argument("--val-every", type=int, default=3, help="batches between Dice validations")
    parser.add_argument("--classes", "-c", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device("cpu")
    model = UNet(n_channels=3, n_classes=args.classes)
    model = model.to(memory_format=torch.channels_last)
    print(f"Network: {model.n_channels} input channels, {model.n_classes} output channels (classes)")
    model.to(device=device)
    train_model(model=model, device=device, args=args)


if __name__ == "__main__":
    main()
