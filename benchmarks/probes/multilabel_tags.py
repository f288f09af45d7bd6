"""Healthy probe: multi-label image tagging as in the Kaggle Planet-Amazon / PASCAL VOC multi-label fine-tuning recipes: nn.BCEWithLogitsLoss with pos_weight from label frequencies on raw logits, torch.sigmoid + 0.5 threshold only for F1, mixup with soft multi-hot targets, and an auxiliary single-label head (weather) trained with nn.CrossEntropyLoss(label_smoothing=0.1).

Loss-input edges: the sigmoid of the training logits is taken in the same step for metrics
(that output never reaches a loss); validation also reports multilabel_soft_margin_loss on
the logits; the mixed targets are float probabilities.
"""
import argparse

import torch
import torch.nn.functional as F
from torch import nn

N_TAGS, N_WEATHER = 8, 3


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 12, 3, padding=1), nn.BatchNorm2d(12), nn.ReLU(),
                                      nn.MaxPool2d(2), nn.Conv2d(12, 24, 3, padding=1), nn.BatchNorm2d(24), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.tags = nn.Linear(24, N_TAGS)
        self.weather = nn.Linear(24, N_WEATHER)

    def forward(self, x):
        h = self.backbone(x)
        return self.tags(h), self.weather(h)


def make_split(gen, n):
    x = torch.randn(n, 3, 16, 16, generator=gen)
    score = x.mean((2, 3)) @ torch.randn(3, N_TAGS, generator=gen)
    tags = (score > 0.3).float()
    weather = x[:, :, :8].mean((1, 2, 3)).gt(0).long() + x[:, 0].mean((1, 2)).gt(0.1).long()
    return x, tags, weather


def f1_score(probs, targets, threshold=0.5):
    preds = (probs > threshold).float()
    tp = (preds * targets).sum()
    return (2 * tp / (preds.sum() + targets.sum()).clamp_min(1)).item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--mixup-alpha", type=float, default=0.4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    x_train, tags_train, weather_train = make_split(gen, args.batch_size * args.steps)
    x_val, tags_val, weather_val = make_split(gen, 48)

    freq = tags_train.mean(0).clamp(0.05, 0.95)
    tag_criterion = nn.BCEWithLogitsLoss(pos_weight=(1 - freq) / freq)
    weather_criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    model = Tagger()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    beta = torch.distributions.Beta(args.mixup_alpha, args.mixup_alpha)

    for step in range(args.steps):
        model.train()
        sl = slice(step * args.batch_size, (step + 1) * args.batch_size)
        x, tags, weather = x_train[sl], tags_train[sl], weather_train[sl]
        lam = float(beta.sample())
        perm = torch.randperm(x.size(0))
        mixed = lam * x + (1 - lam) * x[perm]
        tag_logits, weather_logits = model(mixed)
        loss = tag_criterion(tag_logits, lam * tags + (1 - lam) * tags[perm])
        loss = loss + lam * weather_criterion(weather_logits, weather) \
            + (1 - lam) * weather_criterion(weather_logits, weather[perm])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        train_f1 = f1_score(torch.sigmoid(tag_logits), tags)
        if step % 4 == 3:
            model.eval()
            with torch.no_grad():
                tag_logits, weather_logits = model(x_val)
                val_bce = tag_criterion(tag_logits, tags_val)
                val_msm = F.multilabel_soft_margin_loss(tag_logits, tags_val)
                val_f1 = f1_score(tag_logits.sigmoid(), tags_val)
                val_acc = (weather_logits.argmax(1) == weather_val).float().mean()
            print(f"step {step + 1}: loss {loss.item():.3f} train F1 {train_f1:.3f} val bce {val_bce.item():.3f} "
                  f"msm {val_msm.item():.3f} F1 {val_f1:.3f} weather acc {val_acc.item():.3f}")


if __name__ == "__main__":
    main()
