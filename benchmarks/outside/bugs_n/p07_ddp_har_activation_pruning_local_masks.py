"""Human-activity recognition from 3-axis accelerometer windows with a 1-D CNN, trained with
DDP on 2 gloo ranks and pruned *during* training: after a dense warm-up, half of the
channels of every conv layer are removed with a first-order Taylor criterion on the
activations (|mean(a * dL/da)|, Molchanov et al. 2017, as NNI's TaylorFO pruner), applied with
``torch.nn.utils.prune.custom_from_mask``, and the sparse network is fine-tuned.

Modelled on: microsoft/nni issue #5205 "About pruning model on multi GPUs" (maintainer:
"TaylorFO has bug in DDP (pruning is independently on each device)") and its fix PRs
#5217 / #5242 "fix ddp problem": the Taylor scores are collected with forward hooks and
``autograd.grad`` on each rank's own calibration batches (activation gradients are never
all-reduced by DDP), so every rank ranks the channels on different data and keeps a
different channel set.  The masks are buffers created after the DDP constructor, so DDP
never broadcasts them; the replicas keep identical ``weight_orig`` parameters but compute
with different effective weights from the pruning step on.  The fix all-reduces the
collected score sums and counts before ranking, as the NNI PRs do.

Unusual about the loop: the model is re-parametrised in the middle of DDP training
(``weight`` becomes ``weight_orig * weight_mask``), forward hooks are attached and removed
for a calibration pass, and a DistributedSampler with set_epoch shards the windows.
Run: python -m torch.distributed.run --standalone --nproc-per-node 2 p07_ddp_har_activation_pruning_local_masks.py [--healthy]
"""
import argparse
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils import prune
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

torch.set_num_threads(1)
parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true")
args = parser.parse_args()
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)

CLASSES, WIN, EPOCHS, PRUNE_EPOCH, SPARSITY = 6, 64, 4, 1, 0.5


def make_har(n, g):
    y = torch.randint(0, CLASSES, (n,), generator=g)
    t = torch.arange(WIN).float() / 20.0
    freq = torch.tensor([1.0, 2.2, 0.2, 0.1, 1.5, 1.3])[y][:, None, None]
    amp = torch.tensor([[1.0, 0.6, 0.3], [2.0, 1.2, 0.8], [0.1, 0.1, 0.05], [0.05, 0.1, 0.1],
                        [0.9, 0.9, 0.6], [0.9, 0.4, 1.0]])[y][:, :, None]
    phase = torch.rand(n, 3, 1, generator=g) * 2 * math.pi
    gravity = torch.tensor([[0.0, 0.0, 1.0]]).repeat(n, 1)[:, :, None]
    gravity[y == 2] = torch.tensor([0.0, 1.0, 0.0])[:, None]  # sitting: phone rotated
    x = amp * torch.sin(2 * math.pi * freq * t + phase) + gravity + 0.3 * torch.randn(n, 3, WIN, generator=g)
    return x, y


class HARNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv1d(3, 32, 5, padding=2)
        self.conv2 = nn.Conv1d(32, 32, 5, padding=2)
        self.conv3 = nn.Conv1d(32, 64, 3, padding=1)
        self.fc = nn.Linear(64, CLASSES)

    def forward(self, x):
        x = F.max_pool1d(F.relu(self.conv1(x)), 2)
        x = F.max_pool1d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.conv3(x)).mean(2)
        return self.fc(F.dropout(x, 0.2, self.training))


g = torch.Generator().manual_seed(1)
train_set = TensorDataset(*make_har(1280, g))
test_x, test_y = make_har(600, g)
sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=0)
loader = DataLoader(train_set, batch_size=64, sampler=sampler)
model = DDP(HARNet())
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
convs = [model.module.conv1, model.module.conv2, model.module.conv3]


def taylor_fo_masks(calib_batches):
    """First-order Taylor criterion on activations (Molchanov et al. 2017), as NNI's TaylorFO pruner."""
    sums, counts, acts, hooks = [torch.zeros(c.out_channels) for c in convs], torch.zeros(1), [], []

    def keep_output(module, inp, out):
        acts.append(out)

    for c in convs:
        hooks.append(c.register_forward_hook(keep_output))
    for xb, yb in calib_batches:
        acts.clear()
        loss = F.cross_entropy(model.module(xb), yb)
        grads = torch.autograd.grad(loss, acts)
        for i, (a, ga) in enumerate(zip(acts, grads)):
            sums[i] += (a * ga).mean(2).abs().sum(0).detach()
        counts += xb.size(0)
    for h in hooks:
        h.remove()
    if args.healthy:  # NNI fix: aggregate the statistics of all ranks before ranking
        for s in sums:
            dist.all_reduce(s)
        dist.all_reduce(counts)
    masks = []
    for c, s in zip(convs, sums):
        score = s / counts
        keep = score.topk(int(c.out_channels * (1 - SPARSITY))).indices
        m = torch.zeros(c.out_channels)
        m[keep] = 1.0
        masks.append(m)
    return masks


step = 0
for epoch in range(EPOCHS):
    sampler.set_epoch(epoch)
    batches = list(loader)
    if epoch == PRUNE_EPOCH:
        masks = taylor_fo_masks(batches[:2])
        for c, m in zip(convs, masks):
            prune.custom_from_mask(c, "weight", m[:, None, None].expand_as(c.weight))
        kept = [int(m.sum()) for m in masks]
        if rank == 0:
            print(f"pruned conv channels at step {step}; kept per layer {kept}")
            if not args.healthy:
                print(f"ONSET step {step}")
    model.train()
    for xb, yb in batches:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
        if rank == 0:
            print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
        step += 1


def gathered(t):
    out = [torch.zeros_like(t) for _ in range(world)]
    dist.all_gather(out, t.contiguous())
    return out


mask_disagree = sum((gathered(c.weight_mask[:, 0, 0])[0] != gathered(c.weight_mask[:, 0, 0])[1]).float().sum().item()
                    for c in convs) / sum(c.out_channels for c in convs)
eff_gap = max((lambda a: (a[0] - a[1]).abs().max().item())(gathered(c.weight.detach())) for c in convs)
orig_gap = max((lambda a: (a[0] - a[1]).abs().max().item())(gathered(c.weight_orig.detach())) for c in convs)
model.eval()
with torch.no_grad():
    acc = (model.module(test_x).argmax(1) == test_y).float().mean()
accs = gathered(acc.reshape(1))
if rank == 0:
    print(f"EVIDENCE fraction of conv channels whose keep/prune decision differs between ranks {mask_disagree:.3f}; "
          f"max |effective weight rank0 - rank1| {eff_gap:.4f} (weight_orig gap {orig_gap:.4f}); "
          f"test acc rank0 {accs[0].item():.3f} rank1 {accs[1].item():.3f}")
dist.destroy_process_group()
