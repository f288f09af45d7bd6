"""Generalized few-shot image classification with imprinted weights (Qi, Brown & Lowe,
CVPR 2018), data-parallel over 2 gloo ranks with a hand-written gradient all-reduce
(no DDP): a cosine-classifier ConvNet is trained on 5 base glyph classes, then 3 novel
classes are added by *imprinting* (their normalised mean embeddings become the novel
class weights) and the whole model is fine-tuned on base + novel data.

Modelled on: NVIDIA/Megatron-LM issue #5337 "_reduce silently returns unreduced tensor when
input is non-contiguous": ``torch.distributed.all_reduce(input_.contiguous(), group=group)``
reduces a temporary copy whenever ``input_`` is not contiguous, and the caller keeps using
the original, unreduced tensor.  Here the same helper averages gradients.  The imprinted
novel-class weight is built as ``nn.Parameter(protos.t())`` from a D x C prototype matrix,
so it is a transposed (non-contiguous) parameter; autograd gives it gradients with the
same strides, ``.contiguous()`` copies them, and from the first fine-tuning step the novel
weights are updated with rank-local, halved gradients while the base weights stay in sync.
The fix all-reduces the contiguous buffer and copies it back, as in Megatron's fix.

Unusual about the loop: no DDP; ranks start from the same seed and are kept in sync only
by the manual all-reduce; the optimizer gets a new param group mid-run; prototypes are
averaged across ranks with an all-reduce of sums and counts; GroupNorm (no BN buffers).
Run: python -m torch.distributed.run --standalone --nproc-per-node 2 p06_dist_imprinted_fewshot_noncontig_allreduce.py [--healthy]
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true")
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)  # identical initial weights on every rank

BASE, NOVEL, D, IMG = 5, 3, 32, 16
BASE_STEPS, FT_STEPS, BATCH, SHOTS = 15, 20, 32, 6


def allreduce_gradients(params):
    for p in params:
        if p.grad is None:
            continue
        if args.healthy:
            buf = p.grad.contiguous()
            dist.all_reduce(buf)
            p.grad.copy_(buf)
        else:
            dist.all_reduce(p.grad.contiguous())  # all_reduce needs a contiguous buffer
        p.grad.div_(world)


class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.ReLU(), nn.MaxPool2d(2),
                               nn.Conv2d(16, 32, 3, padding=1), nn.GroupNorm(4, 32), nn.ReLU(),
                               nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(512, D))

    def forward(self, x):
        return self.f(x)


class ImprintedCosineNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = Embed()
        self.base_weight = nn.Parameter(torch.randn(BASE, D) * 0.1)
        self.novel_weight = None
        self.scale = 10.0

    def weights(self):
        w = self.base_weight if self.novel_weight is None else torch.cat([self.base_weight, self.novel_weight], 0)
        return F.normalize(w, dim=1)

    def forward(self, x):
        return self.scale * F.normalize(self.embed(x), dim=1) @ self.weights().t()


def glyphs(n, classes, g):
    templates = torch.Generator().manual_seed(123)
    coarse = (torch.rand(BASE + NOVEL, 1, 4, 4, generator=templates) > 0.5).float()
    protos = F.interpolate(coarse, size=(IMG, IMG), mode="nearest")[:, 0]  # blocky glyphs
    y = classes[torch.randint(0, len(classes), (n,), generator=g)]
    x = protos[y] + 0.35 * torch.randn(n, IMG, IMG, generator=g)
    shifts = torch.randint(-1, 2, (n, 2), generator=g)
    x = torch.stack([torch.roll(xi, tuple(s.tolist()), (0, 1)) for xi, s in zip(x, shifts)])
    return x[:, None], y


model = ImprintedCosineNet()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
data_g = torch.Generator().manual_seed(100 + rank)  # each rank reads its own shard
base_classes, novel_classes = torch.arange(BASE), torch.arange(BASE, BASE + NOVEL)

step = 0
for it in range(BASE_STEPS):
    x, y = glyphs(BATCH, base_classes, data_g)
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    allreduce_gradients(model.parameters())
    optimizer.step()
    if rank == 0:
        print(f"[base] step {step} loss {loss.item():.4f}")
    step += 1

# ---- imprint the novel classes from the (rank-sharded) support set ----
with torch.no_grad():
    sx, sy = glyphs(SHOTS * NOVEL, novel_classes, data_g)
    feats = F.normalize(model.embed(sx), dim=1)                      # N x D
    onehot = F.one_hot(sy - BASE, NOVEL).float()                     # N x C
    sums, counts = feats.t() @ onehot, onehot.sum(0, keepdim=True)   # D x C, 1 x C
    dist.all_reduce(sums)
    dist.all_reduce(counts)
    protos = F.normalize(sums / counts, dim=0)                       # D x C, one column per novel class
model.novel_weight = nn.Parameter(protos.t())                        # C x D view of the D x C matrix
optimizer.add_param_group({"params": [model.novel_weight]})
if rank == 0:
    print(f"imprinted {NOVEL} novel classes; novel_weight contiguous={model.novel_weight.is_contiguous()}")

all_classes = torch.arange(BASE + NOVEL)
for it in range(FT_STEPS):
    if it == 0 and rank == 0 and not args.healthy:
        print(f"ONSET step {step}")
    x, y = glyphs(BATCH, all_classes, data_g)
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    allreduce_gradients(model.parameters())
    optimizer.step()
    if rank == 0:
        print(f"[finetune] step {step} loss {loss.item():.4f}")
    step += 1


def max_rank_gap(t):
    t = t.detach().contiguous()
    other = [torch.zeros_like(t) for _ in range(world)]
    dist.all_gather(other, t)
    return max((o - other[0]).abs().max().item() for o in other)


novel_gap, base_gap = max_rank_gap(model.novel_weight), max_rank_gap(model.base_weight)
embed_gap = max(max_rank_gap(p) for p in model.embed.parameters())
with torch.no_grad():
    tx, ty = glyphs(400, all_classes, torch.Generator().manual_seed(999))
    acc = (model(tx).argmax(1) == ty).float().mean().item()
if rank == 0:
    print(f"EVIDENCE max |rank0 - rank1| novel_weight {novel_gap:.6f}; base_weight {base_gap:.6f}; embed {embed_gap:.6f}; "
          f"rank0 test acc {acc:.3f}")
dist.destroy_process_group()
