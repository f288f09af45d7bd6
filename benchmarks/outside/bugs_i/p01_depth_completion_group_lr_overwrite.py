"""Sparse-to-dense depth completion with a two-rate optimizer (backbone / refinement head).

Modelled on: JUGGHM/PENet_ICRA2021#29 "Question about lr" -- the paper trains the backbone with
lr/10 and the refinement (DA-CSPN++) head with lr, and builds an Adam optimizer with two param
groups for that, but ``helper.adjust_learning_rate`` writes one scalar lr into *every* param group,
so as soon as it touches the optimizer the backbone silently runs at the head's learning rate.

What is unusual about the loop: a PENet-style step decay implemented by hand.  The learning rates
are only rewritten on milestone epochs, so the first epochs train with the intended 10:1 ratio and
the per-group ratio is destroyed at the first milestone.  ``--healthy`` rescales each group from its
own base lr (the fix), which keeps the ratio.
"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)


def make_scene(n, size=32, gen=None):
    """Smooth synthetic depth maps (planes + blobs) with an RGB-like guidance image."""
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, size), torch.linspace(-1, 1, size), indexing="ij")
    a = torch.rand(n, 3, 1, 1, generator=gen)
    depth = 2.0 + a[:, 0:1] * xx + a[:, 1:2] * yy
    for _ in range(3):
        c = torch.rand(n, 2, 1, 1, generator=gen) * 2 - 1
        r = 0.15 + 0.3 * torch.rand(n, 1, 1, 1, generator=gen)
        depth = depth + 0.8 * torch.exp(-((xx - c[:, 0:1]) ** 2 + (yy - c[:, 1:2]) ** 2) / r ** 2)
    rgb = torch.cat([torch.sin(3 * depth), torch.cos(2 * depth), depth / 4], dim=1)
    rgb = rgb + 0.05 * torch.randn(rgb.shape, generator=gen)
    mask = (torch.rand(n, 1, size, size, generator=gen) < 0.05).float()
    return rgb, depth * mask, mask, depth


class ConvBNReLU(nn.Sequential):
    def __init__(self, cin, cout, stride=1):
        super().__init__(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class Backbone(nn.Module):
    """ENet-like colour/depth encoder-decoder producing a coarse depth and guidance features."""

    def __init__(self, ch=16):
        super().__init__()
        self.enc1 = ConvBNReLU(5, ch)
        self.enc2 = ConvBNReLU(ch, 2 * ch, stride=2)
        self.enc3 = ConvBNReLU(2 * ch, 2 * ch)
        self.dec = ConvBNReLU(3 * ch, ch)
        self.depth_head = nn.Conv2d(ch, 1, 3, padding=1)

    def forward(self, rgb, sparse, mask):
        f1 = self.enc1(torch.cat([rgb, sparse, mask], 1))
        f2 = self.enc3(self.enc2(f1))
        up = F.interpolate(f2, size=f1.shape[-2:], mode="bilinear", align_corners=False)
        feat = self.dec(torch.cat([f1, up], 1))
        return 2.0 + self.depth_head(feat), feat


class CSPNRefine(nn.Module):
    """Simplified convolutional spatial propagation: learned 3x3 affinities, a few iterations."""

    def __init__(self, ch=16, iters=4):
        super().__init__()
        self.iters = iters
        self.affinity = nn.Sequential(ConvBNReLU(ch + 1, ch), nn.Conv2d(ch, 9, 3, padding=1))

    def forward(self, coarse, feat, sparse, mask):
        aff = torch.softmax(self.affinity(torch.cat([feat, coarse], 1)), dim=1)
        d = coarse
        for _ in range(self.iters):
            patches = F.unfold(d, 3, padding=1).view(d.shape[0], 9, *d.shape[-2:])
            d = (aff * patches).sum(1, keepdim=True)
            d = mask * sparse + (1 - mask) * d  # keep measured points fixed
        return d


class PENetLite(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = Backbone()
        self.refine = CSPNRefine()

    def forward(self, rgb, sparse, mask):
        coarse, feat = self.backbone(rgb, sparse, mask)
        return coarse, self.refine(coarse, feat, sparse, mask)


def adjust_learning_rate(optimizer, epoch, args):
    """Step decay on milestone epochs (PENet style helper)."""
    if epoch not in args.milestones:
        return
    factor = args.gamma ** sum(epoch >= m for m in args.milestones)
    if args.healthy:
        for group in optimizer.param_groups:
            group["lr"] = group["base_lr"] * factor
    else:
        lr = args.lr * factor
        for group in optimizer.param_groups:
            group["lr"] = lr


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--healthy", action="store_true")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--steps-per-epoch", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--milestones", type=int, nargs="+", default=[2, 3])
    p.add_argument("--gamma", type=float, default=0.5)
    args = p.parse_args()

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    n_train = args.steps_per_epoch * args.batch_size
    train = make_scene(n_train, gen=gen)
    val = make_scene(32, gen=gen)

    model = PENetLite()
    bone_params = [p for p in model.backbone.parameters() if p.requires_grad]
    bone_ids = {id(p) for p in bone_params}
    new_params = [p for p in model.parameters() if p.requires_grad and id(p) not in bone_ids]
    optimizer = torch.optim.Adam(
        [{"params": bone_params, "lr": args.lr / 10}, {"params": new_params}],
        lr=args.lr, weight_decay=1e-6, betas=(0.9, 0.99))
    for group in optimizer.param_groups:
        group["base_lr"] = group["lr"]

    bone_snapshot = None
    step = 0
    for epoch in range(args.epochs):
        model.train()
        adjust_learning_rate(optimizer, epoch, args)
        if epoch == args.milestones[0]:
            bone_snapshot = [p.detach().clone() for p in bone_params]
            if not args.healthy:
                print(f"ONSET step {step}")
        perm = torch.randperm(n_train)
        for i in range(args.steps_per_epoch):
            idx = perm[i * args.batch_size:(i + 1) * args.batch_size]
            rgb, sparse, mask, gt = (t[idx] for t in train)
            coarse, pred = model(rgb, sparse, mask)
            loss = F.mse_loss(pred, gt) + 0.5 * F.mse_loss(coarse, gt)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
        model.eval()
        with torch.no_grad():
            _, pred = model(*val[:3])
            rmse = math.sqrt(F.mse_loss(pred, val[3]).item())
        lrs = [g["lr"] for g in optimizer.param_groups]
        print(f"epoch {epoch} step {step} loss {loss.item():.4f} val_rmse {rmse:.4f} "
              f"lr_backbone {lrs[0]:.2e} lr_refine {lrs[1]:.2e}")

    drift = torch.sqrt(sum(((p.detach() - s) ** 2).sum() for p, s in zip(bone_params, bone_snapshot))).item()
    lrs = [g["lr"] for g in optimizer.param_groups]
    print(f"EVIDENCE backbone/refine lr ratio {lrs[0] / lrs[1]:.3f} (intended 0.100); "
          f"backbone drift after first milestone {drift:.4f}")


if __name__ == "__main__":
    main()
