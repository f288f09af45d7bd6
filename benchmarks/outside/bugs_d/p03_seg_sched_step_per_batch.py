"""P03 (class: learning-rate schedule misapplied -- epoch scheduler stepped every batch) -- plain loop.

Modelled on ivadomed/ivadomed#55 "Fix scheduler updating": "Scheduler was incorrectly
stepped in the batch loop instead of in the epoch loop (mistake in #51), causing the LR
to be updated after each batch instead of after each epoch."  The same mistake is the
subject of pytorch/pytorch#3814 (apaszke: "Scheduler should step after the end of each
epoch, not after every iteration") and of pytorch/tutorials#640.

A small 2-D segmentation U-Net-like net is trained with Dice+BCE.  The recipe's
MultiStepLR milestones ([12, 24]) are expressed in *epochs* (a 40-epoch recipe); this
short run does 3 epochs x 12 iterations.  With `scheduler.step()` inside the batch loop
the first milestone is reached after 12 *iterations*, so from optimizer step 12 the LR
is silently 10x (and from step 24, 100x) too small.
Healthy twin: `scheduler.step()` once per epoch, after the validation pass.
"""
import sys, time
import torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.data import TensorDataset, DataLoader

HEALTHY = "--healthy" in sys.argv
torch.set_num_threads(1)
torch.manual_seed(0)

cfg = {
    "num_epochs": 3,              # truncated run of a 40-epoch recipe
    "batch_size": 16,
    "initial_lr": 1e-2,
    "lr_milestones": [12, 24],    # in epochs
    "lr_gamma": 0.1,
    "img_size": 24,
}


def synth_images(n, g):
    """Blobs on noisy background; mask = blob support."""
    s = cfg["img_size"]
    yy, xx = torch.meshgrid(torch.arange(s), torch.arange(s), indexing="ij")
    imgs, masks = [], []
    for _ in range(n):
        m = torch.zeros(s, s)
        for _ in range(int(torch.randint(1, 4, (1,), generator=g))):
            cy, cx = torch.randint(3, s - 3, (2,), generator=g)
            r = float(torch.randint(2, 6, (1,), generator=g))
            m = torch.maximum(m, (((yy - cy) ** 2 + (xx - cx) ** 2) <= r * r).float())
        img = 0.8 * m + 0.35 * torch.randn(s, s, generator=g) + 0.2 * torch.sin(xx / 3.0)
        imgs.append(img.unsqueeze(0))
        masks.append(m.unsqueeze(0))
    return torch.stack(imgs), torch.stack(masks)


g = torch.Generator().manual_seed(3)
train_ds = TensorDataset(*synth_images(12 * cfg["batch_size"], g))
val_ds = TensorDataset(*synth_images(64, g))
train_loader = DataLoader(train_ds, batch_size=cfg["batch_size"], shuffle=True, drop_last=True,
                          generator=torch.Generator().manual_seed(5))
val_loader = DataLoader(val_ds, batch_size=32)


def conv_block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class SmallUNet(nn.Module):
    def __init__(self, c=12):
        super().__init__()
        self.enc1, self.enc2 = conv_block(1, c), conv_block(c, 2 * c)
        self.bott = conv_block(2 * c, 2 * c)
        self.up = nn.ConvTranspose2d(2 * c, c, 2, stride=2)
        self.dec1 = conv_block(2 * c, c)
        self.out = nn.Conv2d(c, 1, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.bott(self.enc2(F.max_pool2d(e1, 2)))
        d1 = self.dec1(torch.cat([self.up(e2), e1], 1))
        return self.out(d1)


def dice_loss(logits, target, eps=1.0):
    p = torch.sigmoid(logits)
    inter = (p * target).sum((1, 2, 3))
    return 1 - ((2 * inter + eps) / (p.sum((1, 2, 3)) + target.sum((1, 2, 3)) + eps)).mean()


model = SmallUNet()
optimizer = torch.optim.Adam(model.parameters(), lr=cfg["initial_lr"])
scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=cfg["lr_milestones"],
                                                 gamma=cfg["lr_gamma"])

t0 = time.time()
global_step = 0
for epoch in range(cfg["num_epochs"]):
    model.train()
    train_loss = 0.0
    for i, (x, y) in enumerate(train_loader):
        if not HEALTHY and global_step == cfg["lr_milestones"][0]:
            print("ONSET step", global_step)
        optimizer.zero_grad()
        logits = model(x)
        loss = dice_loss(logits, y) + F.binary_cross_entropy_with_logits(logits, y)
        loss.backward()
        optimizer.step()
        if not HEALTHY:
            scheduler.step()                      # BUG: epoch-based scheduler stepped per batch
        train_loss += loss.item()
        if i % 4 == 0:
            print(f"epoch {epoch} it {i:2d} step {global_step:2d} loss {loss.item():.4f} "
                  f"lr {optimizer.param_groups[0]['lr']:.1e}")
        global_step += 1

    model.eval()
    dice = 0.0
    with torch.no_grad():
        for x, y in val_loader:
            dice += (1 - dice_loss(model(x), y, eps=1e-6)).item() * len(x)
    print(f"== epoch {epoch}: train loss {train_loss / len(train_loader):.4f} val dice {dice / len(val_ds):.4f}")
    if HEALTHY:
        scheduler.step()                          # per-epoch, as the schedule intends
print(f"done in {time.time() - t0:.1f}s")
