"""Healthy probe: Hinton et al.'s knowledge distillation written as in HobbitLong/RepDistiller (a DistillKL loss module: kl_div of log_softmax(student / T) against softmax(teacher / T), batchmean, times T**2), after a short teacher pre-training phase; the frozen teacher runs in eval mode under no_grad and its probabilities are also the soft target of cross_entropy.

Loss-input edges: softmax outputs reach kl_div and cross_entropy only as their *target*
(documented and legitimate); the student's input is raw logits or a log_softmax; the held-out
NLL of the teacher/student ensemble is nll_loss on torch.log of the averaged probabilities.
"""
import argparse

import torch
import torch.nn.functional as F
from torch import nn


class DistillKL(nn.Module):
    """KL divergence between temperature-softened distributions (Hinton et al., 2015)."""

    def __init__(self, T):
        super().__init__()
        self.T = T

    def forward(self, y_s, y_t):
        p_s = F.log_softmax(y_s / self.T, dim=1)
        p_t = F.softmax(y_t / self.T, dim=1)
        return F.kl_div(p_s, p_t, reduction="batchmean") * self.T ** 2


def mlp(width, classes=6):
    return nn.Sequential(nn.Linear(12, width), nn.ReLU(), nn.Dropout(0.2), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, classes))


def batch(gen, n=32):
    x = torch.randn(n, 12, generator=gen)
    return x, (x[:, :6].argmax(1) + (x[:, 6] > 1).long()) % 6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--teacher-steps", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--T", type=float, default=4.0)
    parser.add_argument("--alpha", type=float, default=0.9, help="weight of the distillation terms")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)

    teacher, student = mlp(64), mlp(16)
    t_opt = torch.optim.SGD(teacher.parameters(), lr=0.05, momentum=0.9)
    teacher.train()
    for _ in range(args.teacher_steps):
        x, y = batch(gen)
        loss = F.cross_entropy(teacher(x), y)
        t_opt.zero_grad()
        loss.backward()
        t_opt.step()

    teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    criterion_kd, criterion_cls = DistillKL(args.T), nn.CrossEntropyLoss()
    opt = torch.optim.SGD(student.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    student.train()
    for step in range(args.steps):
        x, y = batch(gen)
        logit_s = student(x)
        with torch.no_grad():
            logit_t = teacher(x)
        soft_targets = F.softmax(logit_t, dim=1)          # probabilities as the target: soft labels
        loss = ((1 - args.alpha) * criterion_cls(logit_s, y)
                + args.alpha * criterion_kd(logit_s, logit_t)
                + 0.1 * F.cross_entropy(logit_s, soft_targets))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 4 == 3:
            print(f"step {step + 1} loss {loss.item():.4f}")

    student.eval()
    with torch.no_grad():
        x, y = batch(gen, 64)
        probs = (F.softmax(student(x), dim=1) + F.softmax(teacher(x), dim=1)) / 2
        nll = F.nll_loss(torch.log(probs.clamp_min(1e-8)), y)
        acc = (probs.argmax(1) == y).float().mean()
    print(f"ensemble nll {nll.item():.4f} acc {acc.item():.3f}")


if __name__ == "__main__":
    main()
