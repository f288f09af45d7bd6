"""Healthy probe: a RetinaNet-style dense detection head (as in torchvision's retinanet and Detectron2): a sigmoid focal loss written by hand (torch.sigmoid for the modulating factor, binary_cross_entropy_with_logits with reduction="none") over all non-ignored anchors normalised by the foreground count, smooth_l1_loss (beta=1/9) on the foreground box deltas, and an IoU-quality branch trained with huber_loss on its sigmoid.

Loss-input edges: binary_cross_entropy_with_logits gets the raw class logits while their sigmoid
is taken beside it; huber_loss takes a sigmoid's output (allowed); every regression pair is
(num_fg, 4) or (num_fg,) on both sides.
"""
import argparse

import torch
import torch.nn.functional as F
from torch import nn

NUM_CLASSES, NUM_ANCHORS = 5, 3


def sigmoid_focal_loss(logits, targets, alpha=0.25, gamma=2.0):
    p = torch.sigmoid(logits)
    ce_loss = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    loss = ce_loss * ((1 - p_t) ** gamma)
    alpha_t = alpha * targets + (1 - alpha) * (1 - targets)
    return alpha_t * loss


class DenseHead(nn.Module):
    def __init__(self, channels=16, prior=0.01):
        super().__init__()
        self.trunk = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.GroupNorm(4, channels), nn.ReLU(),
                                   nn.Conv2d(channels, channels, 3, stride=2, padding=1), nn.ReLU())
        self.cls_logits = nn.Conv2d(channels, NUM_ANCHORS * NUM_CLASSES, 3, padding=1)
        self.bbox_reg = nn.Conv2d(channels, NUM_ANCHORS * 4, 3, padding=1)
        self.iou_pred = nn.Conv2d(channels, NUM_ANCHORS, 3, padding=1)
        nn.init.constant_(self.cls_logits.bias, -torch.log(torch.tensor((1 - prior) / prior)).item())

    @staticmethod
    def _flatten(t, k):                              # (N, A*K, H, W) -> (N, H*W*A, K)
        n, _, h, w = t.shape
        return t.view(n, NUM_ANCHORS, k, h, w).permute(0, 3, 4, 1, 2).reshape(n, -1, k)

    def forward(self, images):
        f = self.trunk(images)
        return (self._flatten(self.cls_logits(f), NUM_CLASSES), self._flatten(self.bbox_reg(f), 4),
                self._flatten(self.iou_pred(f), 1).squeeze(-1))


def assign(gen, n, num_anchors):
    """Synthetic matcher output: -2 ignored (between IoU thresholds), -1 background, else the class."""
    matched = torch.full((n, num_anchors), -1, dtype=torch.long)
    r = torch.rand(n, num_anchors, generator=gen)
    matched[r < 0.1] = -2
    fg = r > 0.9
    matched[fg] = torch.randint(0, NUM_CLASSES, (int(fg.sum()),), generator=gen)
    return matched, torch.randn(n, num_anchors, 4, generator=gen) * 0.5, torch.rand(n, num_anchors, generator=gen)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    model = DenseHead()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    warmup = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=4)

    for step in range(args.steps):
        model.train()
        images = torch.randn(4, 3, 16, 16, generator=gen)
        cls_out, box_out, iou_out = model(images)
        matched, box_targets, iou_targets = assign(gen, images.shape[0], cls_out.shape[1])
        valid, foreground = matched != -2, matched >= 0
        num_foreground = max(1, int(foreground.sum()))
        gt_classes = torch.zeros_like(cls_out)
        gt_classes[foreground, matched[foreground]] = 1.0
        loss_cls = sigmoid_focal_loss(cls_out[valid], gt_classes[valid]).sum() / num_foreground
        loss_box = F.smooth_l1_loss(box_out[foreground], box_targets[foreground], beta=1 / 9,
                                    reduction="sum") / num_foreground
        loss_iou = F.huber_loss(torch.sigmoid(iou_out[foreground]), iou_targets[foreground], delta=0.5)
        losses = {"classification": loss_cls, "bbox_regression": loss_box, "iou": loss_iou}
        loss = sum(losses.values())
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        optimizer.step()
        warmup.step()
        print(f"step {step + 1} " + " ".join(f"{k} {v.item():.3f}" for k, v in losses.items()))

    model.eval()
    with torch.no_grad():
        cls_out, box_out, iou_out = model(torch.randn(2, 3, 16, 16, generator=gen))
        scores = torch.sqrt(cls_out.sigmoid() * iou_out.sigmoid()[..., None])
        top = scores.flatten(1).topk(10).values
    print(f"top detection score {top.max().item():.3f}")


if __name__ == "__main__":
    main()
