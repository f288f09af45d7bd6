"""P03 (class: gradient clipping applied to *scaled* AMP gradients -- clip_grad_norm_ before
GradScaler.unscale_) -- plain PyTorch loop, CPU float16 autocast + GradScaler.

Modelled on milesial/Pytorch-UNet#468 "Gradients are clipped before the unscaling" (fixed by PR #470 "Unscale
gradients before clipping"): train.py does `grad_scaler.scale(loss).backward()` then
`torch.nn.utils.clip_grad_norm_(model.parameters(), gradient_clipping)` then `grad_scaler.step(optimizer)`, so
the max-norm is applied to gradients multiplied by the loss scale (65536 at start) and after the implicit
unscale in step() the update is ~1e5x too small.  victorchall/EveryDream2trainer#175 describes the same bug as
"effectively halting training".  The PyTorch AMP examples ("Working with Unscaled Gradients") prescribe
`scaler.unscale_(optimizer)` before clipping.

Here the UNet recipe (RMSprop, BCE+Dice loss, ReduceLROnPlateau on validation Dice, per-epoch checkpoints)
runs its first 12 steps in fp32 (GradScaler(enabled=False), where the missing unscale_ is harmless) and switches
to mixed precision with a fresh enabled GradScaler at step 12 (--amp-start).  From step 12 the clip acts on
scaled gradients.  Healthy twin: grad_scaler.unscale_(optimizer) before clip_grad_norm_.
"""
import argparse
import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--steps-per-epoch", type=int, default=12)
parser.add_argument("--batch-size", type=int, default=6)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--amp-start", type=int, default=12)
parser.add_argument("--gradient-clipping", type=float, default=1.0)
args = parser.parse_args()
HEALTHY = args.healthy
torch.manual_seed(0)


# ---------------- synthetic segmentation data: bright ellipses on textured background ----------------
def make_batch(bs, g, size=24):
    yy, xx = torch.meshgrid(torch.arange(size).float(), torch.arange(size).float(), indexing="ij")
    cy = torch.randint(6, size - 6, (bs, 1, 1), generator=g).float()
    cx = torch.randint(6, size - 6, (bs, 1, 1), generator=g).float()
    ry = torch.randint(3, 6, (bs, 1, 1), generator=g).float()
    rx = torch.randint(3, 6, (bs, 1, 1), generator=g).float()
    mask = (((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1.0).float()
    bg = F.avg_pool2d(torch.randn(bs, 1, size, size, generator=g), 5, 1, 2)
    img = 0.8 * mask.unsqueeze(1) + 2.0 * bg + 0.3 * torch.randn(bs, 1, size, size, generator=g)
    return img, mask.long()


val_gen = torch.Generator().manual_seed(11)
val_loader = [make_batch(16, val_gen)]


class DoubleConv(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.double_conv = nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

    def forward(self, x):
        return self.double_conv(x)


class Down(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.maxpool_conv = nn.Sequential(nn.MaxPool2d(2), DoubleConv(cin, cout))

    def forward(self, x):
        return self.maxpool_conv(x)


class Up(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.up = nn.ConvTranspose2d(cin, cin // 2, 2, stride=2)
        self.conv = DoubleConv(cin, cout)

    def forward(self, x1, x2):
        return self.conv(torch.cat([x2, self.up(x1)], dim=1))


class UNet(nn.Module):
    def __init__(self, n_channels=1, n_classes=1):
        super().__init__()
        self.n_classes = n_classes
        self.inc = DoubleConv(n_channels, 8)
        self.down1 = Down(8, 16)
        self.down2 = Down(16, 32)
        self.up1 = Up(32, 16)
        self.up2 = Up(16, 8)
        self.outc = nn.Conv2d(8, n_classes, 1)

    def forward(self, x):
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        x = self.up1(x3, x2)
        x = self.up2(x, x1)
        return self.outc(x)


def dice_coeff(input, target, epsilon=1e-6):
    inter = 2 * (input * target).sum(dim=(-1, -2))
    sets_sum = input.sum(dim=(-1, -2)) + target.sum(dim=(-1, -2))
    sets_sum = torch.where(sets_sum == 0, inter, sets_sum)
    return ((inter + epsilon) / (sets_sum + epsilon)).mean()


def dice_loss(input, target):
    return 1 - dice_coeff(input, target)


@torch.inference_mode()
def evaluate(net, loader, amp):
    net.eval()
    score = 0.0
    for image, mask_true in loader:
        with torch.autocast("cpu", dtype=torch.float16, enabled=amp):
            mask_pred = net(image)
        mask_pred = (torch.sigmoid(mask_pred.float().squeeze(1)) > 0.5).float()
        score += dice_coeff(mask_pred, mask_true.float()).item()
    net.train()
    return score / len(loader)


model = UNet()
optimizer = torch.optim.RMSprop(model.parameters(), lr=args.lr, weight_decay=1e-8, momentum=0.9, foreach=True)
scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, "max", patience=5)  # maximise Dice
grad_scaler = torch.amp.GradScaler("cpu", enabled=False)  # fp32 warm-up phase
criterion = nn.BCEWithLogitsLoss()
amp = False
global_step = 0
train_gen = torch.Generator().manual_seed(3)
eval_every = 6

for epoch in range(1, args.epochs + 1):
    model.train()
    epoch_loss = 0.0
    for _ in range(args.steps_per_epoch):
        if global_step == args.amp_start:
            amp = True
            grad_scaler = torch.amp.GradScaler("cpu", enabled=True)
            print(f"step {global_step}: switching to mixed precision (float16 autocast + GradScaler)")
            if not HEALTHY:
                print(f"ONSET step {global_step}")
        images, true_masks = make_batch(args.batch_size, train_gen)
        with torch.autocast("cpu", dtype=torch.float16, enabled=amp):
            masks_pred = model(images)
            loss = criterion(masks_pred.squeeze(1), true_masks.float())
            loss = loss + dice_loss(torch.sigmoid(masks_pred.squeeze(1)).float(), true_masks.float())

        optimizer.zero_grad(set_to_none=True)
        grad_scaler.scale(loss).backward()
        if HEALTHY:
            grad_scaler.unscale_(optimizer)
        total_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.gradient_clipping)
        grad_scaler.step(optimizer)
        grad_scaler.update()

        epoch_loss += loss.item()
        if global_step % 3 == 0:
            print(f"epoch {epoch} step {global_step} loss {loss.item():.4f} grad_norm(pre-clip) {total_norm.item():.3f} "
                  f"scale {grad_scaler.get_scale() if amp else 1.0:.0f}")
        global_step += 1
        if global_step % eval_every == 0:
            val_score = evaluate(model, val_loader, amp)
            scheduler.step(val_score)
            print(f"  validation Dice score: {val_score:.4f}  lr {optimizer.param_groups[0]['lr']:.2e}")
    state_dict = model.state_dict()
    torch.save(state_dict, f"p03_checkpoint_epoch{epoch}.pth")
    print(f"epoch {epoch} mean loss {epoch_loss / args.steps_per_epoch:.4f}; checkpoint saved")
