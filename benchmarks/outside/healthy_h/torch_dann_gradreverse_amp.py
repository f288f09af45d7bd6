"""Domain-adversarial training (DANN) with a gradient-reversal autograd.Function, fp16 autocast
on CPU and a GradScaler.

Modelled on: fungtion/DANN (functions.py ReverseLayerF, model.py CNNModel, main.py training loop
with alpha = 2 / (1 + exp(-10 p)) - 1), following Ganin & Lempitsky, "Unsupervised Domain
Adaptation by Backpropagation" (ICML 2015).

Unusual but intended:
  * ReverseLayerF is a custom torch.autograd.Function whose backward *negates and scales* the
    gradient, so the feature extractor deliberately ascends the domain-classifier loss;
  * the reversal strength alpha ramps from 0 to ~1 over training;
  * mixed precision: torch.autocast('cpu', dtype=float16) with torch.amp.GradScaler; the scaler
    may skip optimizer steps whose scaled gradients overflow, and the LR scheduler is only
    advanced when the step was really taken;
  * the label classifier uses weight normalisation (torch.nn.utils.parametrizations.weight_norm),
    so its trainable tensors are original0/original1 rather than weight.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.parametrizations import weight_norm

torch.set_num_threads(1)
torch.manual_seed(0)


class ReverseLayerF(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = alpha
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output.neg() * ctx.alpha, None


class DANNModel(nn.Module):
    def __init__(self, in_dim=20, feat=64, n_classes=4):
        super().__init__()
        self.feature = nn.Sequential(
            nn.Linear(in_dim, 128), nn.BatchNorm1d(128), nn.ReLU(),
            nn.Linear(128, feat), nn.BatchNorm1d(feat), nn.ReLU(),
        )
        self.class_classifier = nn.Sequential(
            weight_norm(nn.Linear(feat, 64)), nn.ReLU(), nn.Dropout(0.2),
            weight_norm(nn.Linear(64, n_classes)),
        )
        self.domain_classifier = nn.Sequential(
            nn.Linear(feat, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 2),
        )

    def forward(self, x, alpha):
        f = self.feature(x)
        return self.class_classifier(f), self.domain_classifier(ReverseLayerF.apply(f, alpha))


def make_domains(n, gen, in_dim=20, n_classes=4):
    centers = torch.randn(n_classes, in_dim, generator=gen) * 2.0
    def draw(shift, rot):
        y = torch.randint(0, n_classes, (n,), generator=gen)
        x = centers[y] + torch.randn(n, in_dim, generator=gen)
        return x @ rot + shift, y
    src = draw(torch.zeros(in_dim), torch.eye(in_dim))
    q, r = torch.linalg.qr(torch.eye(in_dim) + 0.1 * torch.randn(in_dim, in_dim, generator=gen))
    q = q * torch.sign(torch.diagonal(r))  # small rotation close to identity
    tgt = draw(0.5 * torch.ones(in_dim), q)
    return src, tgt


def batches(x, y, bs, gen):
    while True:
        perm = torch.randperm(x.shape[0], generator=gen)
        for i in range(0, x.shape[0] - bs + 1, bs):
            j = perm[i:i + bs]
            yield x[j], y[j]


@torch.no_grad()
def accuracy(model, x, y):
    model.eval()
    with torch.autocast("cpu", dtype=torch.float16):
        logits, _ = model(x, 0.0)
    return (logits.argmax(1) == y).float().mean().item()


def main():
    gen = torch.Generator().manual_seed(0)
    (xs, ys), (xt, yt) = make_domains(4096, gen)
    model = DANNModel()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    n_steps, bs = 60, 128
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + 10 * s / n_steps) ** 0.75)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16, growth_interval=10)
    src_it, tgt_it = batches(xs, ys, bs, gen), batches(xt, yt, bs, gen)
    skipped = 0
    for step in range(n_steps):
        model.train()
        p = step / n_steps
        alpha = 2.0 / (1.0 + math.exp(-10 * p)) - 1.0
        (x_s, y_s), (x_t, _) = next(src_it), next(tgt_it)
        with torch.autocast("cpu", dtype=torch.float16):
            cls_s, dom_s = model(x_s, alpha)
            _, dom_t = model(x_t, alpha)
            err_label = F.cross_entropy(cls_s.float(), y_s)
            err_dom = F.cross_entropy(dom_s.float(), torch.zeros(bs, dtype=torch.long)) + \
                F.cross_entropy(dom_t.float(), torch.ones(bs, dtype=torch.long))
            loss = err_label + err_dom
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        scale_before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        if scaler.get_scale() < scale_before:
            skipped += 1  # overflow: optimizer.step was skipped, keep the LR schedule in sync
        else:
            sched.step()
        if step % 10 == 0 or step == n_steps - 1:
            print(f"step {step:3d} alpha {alpha:.2f} label {err_label.item():.3f} domain {err_dom.item():.3f} "
                  f"scale {scaler.get_scale():.0f} skipped {skipped}")
    print(f"source acc {accuracy(model, xs[:1024], ys[:1024]):.3f}  target acc {accuracy(model, xt[:1024], yt[:1024]):.3f}")


if __name__ == "__main__":
    main()
