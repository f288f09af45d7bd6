"""P05 (class: gradient clipping misapplied under AMP -- clipping the *scaled* gradients) -- plain loop.

Modelled on milesial/Pytorch-UNet#468 "Gradients are clipped before the unscaling" (fixed
by PR #470 "Unscale gradients before clipping"): train.py does
`grad_scaler.scale(loss).backward(); clip_grad_norm_(model.parameters(), gradient_clipping);
grad_scaler.step(optimizer)` with no `grad_scaler.unscale_(optimizer)` in between, so the
norm that is clipped is the loss-scaled one (x65536).  Same bug: rwth-i6/returnn#1590
"Torch: gradient_clip wrong when grad_scaler is used" and victorchall/EveryDream2trainer#175
("... rather than the common/expected 1.0 ... instead of effectively halting training").

CPU fp16 autocast + torch.amp.GradScaler("cpu"), a small U-Net, SGD with momentum.  The
recipe runs the first 12 iterations (LR warm-up) without clipping and enables
`--gradient-clipping 1.0` from iteration 12 on; from that step every update is the
clipped *scaled* gradient divided by the scale, i.e. ~1/65536 of a unit-norm step, and
training silently stalls.  Healthy twin: `grad_scaler.unscale_(optimizer)` before clipping.
"""
import sys, time
import torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.data import TensorDataset, DataLoader

HEALTHY = "--healthy" in sys.argv
torch.set_num_threads(1)
torch.manual_seed(0)

args = dict(epochs=3, batch_size=8, lr=0.05, momentum=0.9, weight_decay=1e-8, amp=True,
            gradient_clipping=1.0, clip_start_iter=12, warmup_iters=12, n_classes=3, size=32)


# ------------------------------------------------------------------ model (U-Net) ----
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
    def __init__(self, n_channels=3, n_classes=3, c=8):
        super().__init__()
        self.n_classes = n_classes
        self.inc = DoubleConv(n_channels, c)
        self.down1, self.down2 = Down(c, 2 * c), Down(2 * c, 4 * c)
        self.up1, self.up2 = Up(4 * c, 2 * c), Up(2 * c, c)
        self.outc = nn.Conv2d(c, n_classes, 1)

    def forward(self, x):
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        return self.outc(self.up2(self.up1(x3, x2), x1))


def dice_loss(logits, true_1hot, eps=1e-6):
    p = logits.softmax(1).float()
    inter = (p * true_1hot).sum((0, 2, 3))
    return 1 - ((2 * inter + eps) / (p.sum((0, 2, 3)) + true_1hot.sum((0, 2, 3)) + eps)).mean()


# ------------------------------------------------------------------- synthetic data ----
def synth(n, g):
    s = args["size"]
    yy, xx = torch.meshgrid(torch.arange(s).float(), torch.arange(s).float(), indexing="ij")
    imgs, masks = torch.zeros(n, 3, s, s), torch.zeros(n, s, s, dtype=torch.long)
    for i in range(n):
        for cls in (1, 2):
            cy, cx = (torch.rand(2, generator=g) * (s - 8) + 4).tolist()
            r = 3 + 4 * torch.rand(1, generator=g).item()
            region = ((yy - cy) ** 2 + (xx - cx) ** 2) <= r * r if cls == 1 else \
                ((yy - cy).abs() <= r) & ((xx - cx).abs() <= r)
            masks[i][region] = cls
        colors = torch.tensor([[0.1, 0.1, 0.1], [0.9, 0.2, 0.3], [0.2, 0.8, 0.6]])
        imgs[i] = colors[masks[i]].permute(2, 0, 1) + 0.3 * torch.randn(3, s, s, generator=g)
    return imgs, masks


g = torch.Generator().manual_seed(17)
train_set = TensorDataset(*synth(12 * args["batch_size"], g))
val_set = TensorDataset(*synth(32, g))
train_loader = DataLoader(train_set, batch_size=args["batch_size"], shuffle=True, drop_last=True,
                          generator=torch.Generator().manual_seed(1))
val_loader = DataLoader(val_set, batch_size=16, shuffle=False)


@torch.inference_mode()
def evaluate(net):
    net.eval()
    score = 0.0
    for image, mask_true in val_loader:
        with torch.autocast("cpu", dtype=torch.float16, enabled=args["amp"]):
            mask_pred = net(image)
        t = F.one_hot(mask_true, net.n_classes).permute(0, 3, 1, 2).float()
        p = F.one_hot(mask_pred.argmax(1), net.n_classes).permute(0, 3, 1, 2).float()
        score += (1 - dice_loss(p * 1e4, t)).item()     # hard dice
    net.train()
    return score / len(val_loader)


# ---------------------------------------------------------------------------- train ----
model = UNet(n_classes=args["n_classes"])
optimizer = torch.optim.SGD(model.parameters(), lr=args["lr"], momentum=args["momentum"],
                            weight_decay=args["weight_decay"], foreach=True)
warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=args["warmup_iters"])
grad_scaler = torch.amp.GradScaler("cpu", enabled=args["amp"])
criterion = nn.CrossEntropyLoss()

t0 = time.time()
global_step = 0
for epoch in range(1, args["epochs"] + 1):
    model.train()
    epoch_loss = 0
    for images, true_masks in train_loader:
        with torch.autocast("cpu", dtype=torch.float16, enabled=args["amp"]):
            masks_pred = model(images)
            loss = criterion(masks_pred, true_masks)
            loss = loss + dice_loss(masks_pred, F.one_hot(true_masks, model.n_classes).permute(0, 3, 1, 2).float())

        optimizer.zero_grad(set_to_none=True)
        grad_scaler.scale(loss).backward()
        if global_step >= args["clip_start_iter"]:
            if HEALTHY:
                grad_scaler.unscale_(optimizer)
            elif global_step == args["clip_start_iter"]:
                print("ONSET step", global_step)
            torch.nn.utils.clip_grad_norm_(model.parameters(), args["gradient_clipping"])
        grad_scaler.step(optimizer)
        grad_scaler.update()
        warmup.step()

        epoch_loss += loss.item()
        if global_step % 3 == 0:
            print(f"epoch {epoch} step {global_step:2d} loss {loss.item():.4f} lr {optimizer.param_groups[0]['lr']:.4f}")
        global_step += 1

    val_score = evaluate(model)
    print(f"== epoch {epoch}: mean loss {epoch_loss / len(train_loader):.4f}  validation dice {val_score:.4f}")
print(f"done: {global_step} steps in {time.time() - t0:.1f}s")
