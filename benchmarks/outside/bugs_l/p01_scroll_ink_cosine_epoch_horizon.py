"""Ink detection on CT volume crops with a small 3D U-Net. The LR schedule is a
per-iteration cosine with warm-up.

Modelled on: ScrollPrize/villa PR #1495 "Fix per-iteration LR schedulers being given
an epoch count as their horizon". ``_get_scheduler`` passed ``max_steps=mgr.max_epoch``
to schedulers that are stepped once per optimizer step (``diffusers_cosine_warmup``,
``onecycle``...). The cosine therefore reached zero after ``max_epoch`` *iterations*
and then climbed back towards the peak, again and again ("decays to zero 140 times
over the run"). The fix multiplies the horizon by the number of iterations per epoch.

What is unusual about the loop: the warm-up is given in iterations, so it is the same
in both variants. The cosine part only diverges on the first iteration after the
warm-up. ``--healthy`` passes ``max_epoch * iters_per_epoch`` as the horizon.
Loss: BCE + soft Dice on a sparse ink mask, with the border of each crop ignored.
"""
import math
import sys
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from transformers import get_cosine_schedule_with_warmup

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv


@dataclass
class ConfigManager:
    max_epoch: int = 12
    max_steps_per_epoch: int = 5
    batch_size: int = 4
    patch: int = 16
    initial_lr: float = 2e-3
    weight_decay: float = 1e-4
    warmup_steps: int = 5
    scheduler: str = "diffusers_cosine_warmup"


class InkVolumeDataset(Dataset):
    """Synthetic papyrus crops: layered 'fibres' plus a few ink strokes that raise density."""

    def __init__(self, n, patch, seed):
        g = torch.Generator().manual_seed(seed)
        z = torch.arange(patch).float()
        self.vols, self.masks = [], []
        for _ in range(n):
            fibres = torch.sin(z.view(-1, 1, 1) * 0.9 + torch.rand(1, generator=g) * 6).expand(patch, patch, patch)
            vol = 0.3 * fibres + 0.4 * torch.randn(patch, patch, patch, generator=g)
            mask = torch.zeros(patch, patch, patch)
            for _ in range(int(torch.randint(1, 4, (1,), generator=g))):
                c = torch.randint(3, patch - 3, (3,), generator=g)
                r = int(torch.randint(2, 4, (1,), generator=g))
                sl = tuple(slice(int(ci) - r, int(ci) + r) for ci in c)
                mask[sl] = 1.0
            vol = vol + 1.2 * mask
            self.vols.append(vol.unsqueeze(0))
            self.masks.append(mask.unsqueeze(0))

    def __len__(self):
        return len(self.vols)

    def __getitem__(self, i):
        return {"image": self.vols[i], "ink": self.masks[i]}


def conv_block(cin, cout):
    return nn.Sequential(nn.Conv3d(cin, cout, 3, padding=1), nn.InstanceNorm3d(cout, affine=True), nn.LeakyReLU(0.01, inplace=True))


class UNet3D(nn.Module):
    def __init__(self, c=8):
        super().__init__()
        self.enc1, self.enc2 = conv_block(1, c), conv_block(c, 2 * c)
        self.up = nn.ConvTranspose3d(2 * c, c, 2, stride=2)
        self.dec1 = conv_block(2 * c, c)
        self.head = nn.Conv3d(c, 1, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool3d(e1, 2))
        d1 = self.dec1(torch.cat([self.up(e2), e1], 1))
        return self.head(d1)


def masked_bce_dice(logits, target, border=2):
    valid = torch.zeros_like(target)
    valid[..., border:-border, border:-border, border:-border] = 1.0
    bce = (F.binary_cross_entropy_with_logits(logits, target, reduction="none") * valid).sum() / valid.sum()
    p = torch.sigmoid(logits) * valid
    dice = 1 - (2 * (p * target).sum() + 1) / (p.sum() + (target * valid).sum() + 1)
    return bce + dice


def _get_scheduler(mgr, optimizer, iters_per_epoch):
    if mgr.scheduler == "diffusers_cosine_warmup":
        if HEALTHY:  # the fix: the horizon of a per-iteration scheduler is counted in iterations
            max_steps = mgr.max_epoch * iters_per_epoch
        else:
            max_steps = mgr.max_epoch
        return get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=mgr.warmup_steps, num_training_steps=max_steps)
    raise ValueError(mgr.scheduler)


def main():
    torch.manual_seed(0)
    mgr = ConfigManager()
    train_ds = InkVolumeDataset(mgr.max_steps_per_epoch * mgr.batch_size, mgr.patch, seed=1)
    val_ds = InkVolumeDataset(8, mgr.patch, seed=2)
    loader = DataLoader(train_ds, batch_size=mgr.batch_size, shuffle=True, generator=torch.Generator().manual_seed(3))
    model = UNet3D()
    optimizer = torch.optim.AdamW(model.parameters(), lr=mgr.initial_lr, weight_decay=mgr.weight_decay)
    iters_per_epoch = min(len(loader), mgr.max_steps_per_epoch)
    scheduler = _get_scheduler(mgr, optimizer, iters_per_epoch)
    onset = mgr.warmup_steps + 1  # first iteration where the cosine horizon matters

    lrs, global_step = [], 0
    for epoch in range(mgr.max_epoch):
        model.train()
        running = 0.0
        for i, batch in enumerate(loader):
            if i >= mgr.max_steps_per_epoch:
                break
            if not HEALTHY and global_step == onset:
                print(f"ONSET step {onset}")
            optimizer.zero_grad(set_to_none=True)
            loss = masked_bce_dice(model(batch["image"]), batch["ink"])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            lrs.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
            running += loss.item()
            global_step += 1
        model.eval()
        with torch.no_grad():
            vl = sum(masked_bce_dice(model(v["image"].unsqueeze(0)), v["ink"].unsqueeze(0)).item() for v in val_ds) / len(val_ds)
        if epoch % 3 == 2 or epoch == mgr.max_epoch - 1:
            print(f"epoch {epoch:2d} train {running / iters_per_epoch:.4f} val {vl:.4f} lr {lrs[-1]:.2e}")

    troughs = sum(1 for s in range(mgr.warmup_steps + 1, len(lrs) - 1) if lrs[s] < lrs[s - 1] and lrs[s + 1] > lrs[s])
    min_step = min(range(mgr.warmup_steps, len(lrs)), key=lambda s: lrs[s])
    print(f"EVIDENCE lr_at_last_step={lrs[-1]:.2e} (peak {mgr.initial_lr:.1e}) lr_min_at_step={min_step} "
          f"cosine_troughs={troughs} final_val_loss={vl:.4f}")


if __name__ == "__main__":
    main()
