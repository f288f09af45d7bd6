"""Healthy probe: Precise BatchNorm as in fvcore.nn.precise_bn.update_bn_stats run by detectron2's PreciseBN hook before each periodic evaluation: under @torch.no_grad() with the model left in train mode and no optimizer involved, every BatchNorm's momentum is set to 1.0, the per-batch statistics of a few training batches are averaged by hand, the averages are assigned back as the running_mean/running_var buffers and the momentum is restored; the model is then evaluated in eval mode and training continues.

The recalibration pass is a statistics pass, not an evaluation: BatchNorm must run in training
mode for it to compute batch statistics at all.
"""
import argparse

import torch
import torch.nn.functional as F
from torch import nn

BN_MODULE_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d)


@torch.no_grad()
def update_bn_stats(model, batches, num_iters):
    bn_layers = [m for m in model.modules() if isinstance(m, BN_MODULE_TYPES) and m.training]
    if not bn_layers:
        return
    momentum_actual = [bn.momentum for bn in bn_layers]
    for bn in bn_layers:
        bn.momentum = 1.0         # running stats now hold the last batch's statistics exactly
    running_mean = [torch.zeros_like(bn.running_mean) for bn in bn_layers]
    running_var = [torch.zeros_like(bn.running_var) for bn in bn_layers]
    for ind, inputs in enumerate(batches[:num_iters]):
        model(inputs)
        for i, bn in enumerate(bn_layers):
            running_mean[i] += (bn.running_mean - running_mean[i]) / (ind + 1)
            running_var[i] += (bn.running_var - running_var[i]) / (ind + 1)
    for i, bn in enumerate(bn_layers):
        bn.running_mean = running_mean[i]
        bn.running_var = running_var[i]
        bn.momentum = momentum_actual[i]


class SmallConvNet(nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Sequential(nn.Linear(32, 32), nn.BatchNorm1d(32), nn.ReLU(inplace=True), nn.Linear(32, classes))

    def forward(self, x):
        return self.fc(self.features(x))


def make_batch(gen, n):
    y = torch.randint(0, 4, (n,), generator=gen)
    x = torch.randn(n, 3, 8, 8, generator=gen)
    x[:, 0] += (y == 1).float()[:, None, None] * 1.5
    x[:, 1] += (y == 2).float()[:, None, None] * 1.5
    x[:, 2] -= (y == 3).float()[:, None, None] * 1.5
    return x, y


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--eval-period", type=int, default=4)
    parser.add_argument("--precise-bn-iters", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    train_set = [make_batch(gen, args.batch_size) for _ in range(6)]
    val_x, val_y = make_batch(gen, 64)

    model = SmallConvNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    model.train()
    for step in range(args.steps):
        x, y = train_set[step % len(train_set)]
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step + 1} loss {loss.item():.4f}")

        if (step + 1) % args.eval_period == 0:
            # PreciseBN hook: runs right before the evaluation hook, model still in train mode
            update_bn_stats(model, [bx for bx, _ in train_set], args.precise_bn_iters)
            model.eval()
            with torch.no_grad():
                acc = (model(val_x).argmax(1) == val_y).float().mean()
            print(f"  eval acc with precise BN {acc.item():.3f}")
            model.train()


if __name__ == "__main__":
    main()
