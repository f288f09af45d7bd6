"""Distributed (2-rank gloo DDP) domain-adversarial training (DANN) on tabular data.

A feature extractor + label classifier + domain discriminator (behind a gradient-reversal
layer) are combined in one `DomainAdapter` module that is wrapped in DistributedDataParallel.
The first phase is source-only supervised warm-up; the adversarial phase then also feeds an
unlabeled, covariate-shifted target domain.
Launch: python -m torch.distributed.run --standalone --nproc-per-node 2 p07_ddp_dann_submodule_bypass.py

Modelled on: intel/e2eAIOK PR #198 "DDP grads not sync bug fix in domain adapter" — the model
(classifier network A + discriminator network B combined in a model T wrapped with DDP) was run
by "taking out model A and model B to perform the forward pass" (`model.module.<sub>(...)`).
The DDP forward is bypassed, its reducer is never armed, backward does no all-reduce, and each
rank silently trains its own copy.

Unusual about the loop: the warm-up phase calls the DDP wrapper (gradients are synchronised);
only the adversarial phase takes the sub-modules out of `.module`, so the ranks are identical
for the warm-up steps and diverge from the first adversarial step on.
--healthy: the adversarial phase goes through the DDP wrapper as well
(`ddp_model(x_src, x_tgt, lambd)`), as in the fix.
"""
import math
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

torch.set_num_threads(1)
HEALTHY = "--healthy" in sys.argv

N_FEAT = 20


class GradReverse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, lambd):
        ctx.lambd = lambd
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return -ctx.lambd * g, None


class DomainAdapter(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(N_FEAT, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU())
        self.classifier = nn.Linear(32, 3)
        self.discriminator = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x_src, x_tgt=None, lambd=0.0):
        f_src = self.backbone(x_src)
        logits = self.classifier(f_src)
        if x_tgt is None:
            return logits
        f_all = torch.cat([f_src, self.backbone(x_tgt)])
        return logits, self.discriminator(GradReverse.apply(f_all, lambd)).squeeze(1)


def make_domains(n, rank, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N_FEAT, 3, generator=g)
    shift = torch.randn(N_FEAT, generator=g) * 0.8
    scale = 1 + 0.5 * torch.rand(N_FEAT, generator=g)
    g_r = torch.Generator().manual_seed(seed + 1 + rank)          # each rank gets its own shard
    xs = torch.randn(n, N_FEAT, generator=g_r)
    ys = (xs @ w).argmax(1)
    xt = torch.randn(n, N_FEAT, generator=g_r) * scale + shift
    yt = ((xt - shift) / scale @ w).argmax(1)
    return xs, ys, xt, yt


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    xs, ys, xt, yt = make_domains(2048, rank)
    model = DomainAdapter()
    ddp_model = DDP(model, find_unused_parameters=True)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.05, momentum=0.9)
    warmup_steps, total_steps, bs = 10, 36, 64

    for step in range(total_steps):
        sl = slice((step * bs) % len(xs), (step * bs) % len(xs) + bs)
        x_src, y_src, x_tgt = xs[sl], ys[sl], xt[sl]
        if step < warmup_steps:
            logits = ddp_model(x_src)
            loss = F.cross_entropy(logits, y_src)
            dom_loss = torch.zeros(())
        else:
            p = (step - warmup_steps) / (total_steps - warmup_steps)
            lambd = 2.0 / (1.0 + math.exp(-10 * p)) - 1.0
            if HEALTHY:
                logits, dom_logits = ddp_model(x_src, x_tgt, lambd)
            else:
                if step == warmup_steps and rank == 0:
                    print(f"ONSET step {step}", flush=True)
                net = ddp_model.module
                f_src, f_tgt = net.backbone(x_src), net.backbone(x_tgt)
                logits = net.classifier(f_src)
                dom_logits = net.discriminator(GradReverse.apply(torch.cat([f_src, f_tgt]), lambd)).squeeze(1)
            dom_y = torch.cat([torch.zeros(len(x_src)), torch.ones(len(x_tgt))])
            dom_loss = F.binary_cross_entropy_with_logits(dom_logits, dom_y)
            loss = F.cross_entropy(logits, y_src) + dom_loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0:
            print(f"step {step:3d} loss {loss.item():.4f} dom_loss {dom_loss.item():.4f}", flush=True)

    with torch.no_grad():
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        gathered = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, flat)
        tgt_acc = (model(xt[-512:]).argmax(1) == yt[-512:]).float().mean().item()
    if rank == 0:
        diff = (gathered[0] - gathered[1]).abs().max().item()
        print(f"EVIDENCE max_abs_param_diff_rank0_vs_rank1={diff:.6f} rank0_target_acc={tgt_acc:.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
