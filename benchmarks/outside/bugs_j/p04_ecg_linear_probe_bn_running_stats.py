"""ECG beat classification: pre-train a 1D CNN (with BatchNorm) on recordings
from hospital A, then transfer to hospital B by freezing the backbone and
training a new linear head only (linear probing).

Modelled on: pytorch/pytorch#86590 "Easy way to 'freeze' BatchNorm
running_mean/running_var" (and isht7/pytorch-deeplab-resnet#39 "Frozen the
statistics of BN?").  The reporter froze a feature extractor with
``param.requires_grad = False`` and kept calling ``model.train()``; because
BatchNorm updates ``running_mean``/``running_var`` whenever the module is in
training mode, "after training I end up with a model where all batchnorm
params have changed" -- the supposedly frozen backbone silently re-estimates
its statistics on the new domain, so the features the head is trained on (in
train mode, batch stats) are not the ones it sees at evaluation (running
stats), and the pre-trained backbone is no longer the one that was frozen.
The fix is to also put the frozen BatchNorm layers in eval mode during the
probing phase (``backbone.eval()`` after every ``model.train()``).

Unusual about the loop: two phases in one run with one Adam optimizer (12
steps of supervised pre-training on A, then 24 steps where only the head is
re-fitted on B; frozen parameters get no .grad so Adam skips them), the
learning rate is raised by hand for phase 2, baseline wander and gain drift
in the target domain.
Run: python p04_ecg_linear_probe_bn_running_stats.py [--healthy]
"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)


def synth_ecg(n, seed, domain):
    """5 beat morphologies (N, S, V, F, Q) rendered as sums of Gaussians; domain B
    adds baseline wander, a different amplifier gain and more noise."""
    g = torch.Generator().manual_seed(seed)
    t = torch.linspace(0, 1, 180)
    centers = torch.tensor([[0.2, 0.45, 0.7], [0.15, 0.45, 0.75], [0.3, 0.5, 0.8],
                            [0.2, 0.4, 0.65], [0.25, 0.5, 0.6]])
    widths = torch.tensor([[0.03, 0.01, 0.05], [0.02, 0.012, 0.04], [0.05, 0.04, 0.06],
                           [0.03, 0.02, 0.03], [0.04, 0.015, 0.07]])
    amps = torch.tensor([[0.2, 1.0, 0.3], [0.3, 0.8, 0.25], [-0.2, 1.4, -0.5],
                         [0.15, 0.9, 0.5], [0.1, 0.6, 0.2]])
    y = torch.randint(0, 5, (n,), generator=g)
    jitter = 0.02 * torch.randn(n, 3, generator=g)
    c = centers[y] + jitter
    x = (amps[y].unsqueeze(-1) * torch.exp(-(t - c.unsqueeze(-1)) ** 2
                                           / (2 * widths[y].unsqueeze(-1) ** 2))).sum(1)
    if domain == "B":
        phase = 2 * math.pi * torch.rand(n, 1, generator=g)
        x = 1.8 * x + 0.6 * torch.sin(2 * math.pi * 0.7 * t + phase) + 0.4
        x = x + 0.15 * torch.randn(n, 180, generator=g)
    else:
        x = x + 0.05 * torch.randn(n, 180, generator=g)
    return x.unsqueeze(1), y


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        layers, c = [], 1
        for c_out in (16, 32, 64):
            layers += [nn.Conv1d(c, c_out, 7, padding=3), nn.BatchNorm1d(c_out), nn.ReLU(),
                       nn.MaxPool1d(2)]
            c = c_out
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x).mean(-1)


def bn_buffers(module):
    return torch.cat([torch.cat([m.running_mean, m.running_var])
                      for m in module.modules() if isinstance(m, nn.BatchNorm1d)]).clone()


@torch.no_grad()
def evaluate(backbone, head, x, y):
    backbone.eval(); head.eval()
    return (head(backbone(x)).argmax(1) == y).float().mean().item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--healthy", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)

    xa, ya = synth_ecg(12 * 64, seed=1, domain="A")
    xb, yb = synth_ecg(24 * 64, seed=2, domain="B")
    xb_val, yb_val = synth_ecg(512, seed=3, domain="B")

    backbone = Backbone()
    head_a = nn.Linear(64, 5)
    opt = torch.optim.Adam(list(backbone.parameters()) + list(head_a.parameters()), lr=3e-3)
    step = 0
    # ---------------- phase 1: supervised pre-training on hospital A ----------------
    for xb_, yb_ in torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xa, ya),
                                                batch_size=64, shuffle=True):
        backbone.train(); head_a.train()
        loss = F.cross_entropy(head_a(backbone(xb_)), yb_)
        opt.zero_grad(); loss.backward(); opt.step()
        step += 1
    print(f"pre-training done after {step} steps, loss {loss.item():.4f}")

    # ---------------- phase 2: re-fit the head on hospital B, backbone frozen ----------------
    for p in backbone.parameters():
        p.requires_grad = False  # Adam skips parameters whose .grad stays None
    model = nn.Sequential(backbone, head_a)
    for group in opt.param_groups:
        group["lr"] = 1e-2
    frozen_stats = bn_buffers(backbone)
    frozen_weights = torch.cat([p.flatten() for p in backbone.parameters()]).clone()
    if not args.healthy:
        print(f"ONSET step {step}")
    loader_b = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xb, yb),
                                           batch_size=64, shuffle=True)
    for i, (x_, y_) in enumerate(loader_b):
        model.train()
        if args.healthy:
            backbone.eval()  # frozen feature extractor: keep BN statistics fixed
        loss = F.cross_entropy(model(x_), y_)
        opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
        step += 1
        if i % 6 == 0:
            print(f"step {step:3d} probe loss {loss.item():.4f}")

    drift = (bn_buffers(backbone) - frozen_stats).abs().max().item()
    wdrift = (torch.cat([p.flatten() for p in backbone.parameters()]) - frozen_weights).abs().max().item()
    acc = evaluate(backbone, head_a, xb_val, yb_val)
    print(f"EVIDENCE frozen-backbone BN running-stat max change={drift:.4f} "
          f"(weights change={wdrift:.4f}) | probe val acc (eval mode)={acc:.3f}")


if __name__ == "__main__":
    main()
