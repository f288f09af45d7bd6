"""SwAV self-supervised pre-training with multi-crop, distributed Sinkhorn and a per-rank queue (DDP, gloo).

Modelled on: facebookresearch/swav ``main_swav.py`` and ``src/resnet50.py`` (Caron et al.,
"Unsupervised Learning of Visual Features by Contrasting Cluster Assignments", NeurIPS 2020):
the prototype matrix is L2-normalised in place under ``torch.no_grad()`` before every forward;
the multi-crop forward groups crops by resolution (``torch.unique_consecutive``); codes come
from ``distributed_sinkhorn`` (sums all-reduced over ranks); ``p.grad = None`` for the
prototypes during the first ``freeze_prototypes_niters`` iterations; the feature queue starts at
``epoch_queue_starts`` and is *per rank* (SwAV saves it as ``queue<rank>.pth``); the lr follows a
linear warm-up from ``start_warmup`` then cosine, written into the param groups each iteration.
LARS/apex and SyncBatchNorm are GPU-only, so SGD and per-rank BatchNorm are used here.

Unusual (but intended) things about the loop:
* the prototype weights are edited in place (re-normalised) outside the optimizer every step
  and receive no update for the first 10 iterations although the loss depends on them;
* each rank keeps its own queue of past embeddings: queues differ between ranks on purpose,
  while the DDP-synchronised weights must stay identical (checked at the end);
* the assignment targets are computed under ``no_grad`` with a collective (all_reduce) inside
  the loss computation; augmentations use a per-rank generator (seed + rank);
* the lr warms up from 0; only rank 0 prints and evaluates cluster purity.
"""
import math
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)

ARGS = dict(nmb_crops=[2, 2], size_crops=[16, 8], crops_for_assign=[0, 1], temperature=0.1,
            epsilon=0.05, sinkhorn_iterations=3, feat_dim=32, nmb_prototypes=20, queue_length=128,
            epoch_queue_starts=2, epochs=5, batch_size=32, base_lr=0.3, final_lr=0.003,
            warmup_epochs=1, start_warmup=0.0, freeze_prototypes_niters=10, wd=1e-6)


class SwAVNet(nn.Module):
    def __init__(self, feat_dim, nmb_prototypes):
        super().__init__()
        def block(cin, cout):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))
        self.backbone = nn.Sequential(block(3, 16), block(16, 32), nn.MaxPool2d(2), block(32, 32),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.projection_head = nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(inplace=True),
                                             nn.Linear(64, feat_dim))
        self.prototypes = nn.Linear(feat_dim, nmb_prototypes, bias=False)

    def forward_head(self, x):
        x = nn.functional.normalize(self.projection_head(x), dim=1, p=2)
        return x, self.prototypes(x)

    def forward(self, inputs):
        idx_crops = torch.cumsum(torch.unique_consecutive(
            torch.tensor([inp.shape[-1] for inp in inputs]), return_counts=True)[1], 0)
        start_idx, output = 0, None
        for end_idx in idx_crops:
            _out = self.backbone(torch.cat(inputs[start_idx:end_idx]))
            output = _out if output is None else torch.cat((output, _out))
            start_idx = end_idx
        return self.forward_head(output)


def make_images(n, seed):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 8, (n,), generator=g)
    palette = torch.rand(8, 3, 1, 1, generator=torch.Generator().manual_seed(99))
    freq = torch.arange(8).float() % 4 + 1
    yy = torch.linspace(0, 2 * math.pi, 20).view(1, 20, 1)
    imgs = []
    for y in labels:
        pattern = torch.sin(freq[y] * yy + (y >= 4) * yy.transpose(1, 2) * freq[y])
        imgs.append(palette[y] * (1 + pattern) + 0.2 * torch.randn(3, 20, 20, generator=g))
    return torch.stack(imgs), labels


def multi_crop(x, g):
    """RandomResizedCrop + flip + brightness jitter, per sample, via affine_grid."""
    crops, n = [], x.shape[0]
    for n_crops, size, (lo, hi) in zip(ARGS["nmb_crops"], ARGS["size_crops"], [(0.6, 1.0), (0.25, 0.5)]):
        for _ in range(n_crops):
            scale = lo + (hi - lo) * torch.rand(n, generator=g)
            shift = (1 - scale).unsqueeze(1) * (2 * torch.rand(n, 2, generator=g) - 1)
            flip = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
            theta = torch.zeros(n, 2, 3)
            theta[:, 0, 0], theta[:, 1, 1] = scale * flip, scale
            theta[:, :, 2] = shift
            grid = F.affine_grid(theta, (n, 3, size, size), align_corners=False)
            c = F.grid_sample(x, grid, mode="bilinear", align_corners=False)
            crops.append(c * (0.8 + 0.4 * torch.rand(n, 1, 1, 1, generator=g)))
    return crops


@torch.no_grad()
def distributed_sinkhorn(out, world_size):
    Q = torch.exp(out / ARGS["epsilon"]).t()
    B = Q.shape[1] * world_size
    K = Q.shape[0]
    sum_Q = torch.sum(Q)
    dist.all_reduce(sum_Q)
    Q /= sum_Q
    for _ in range(ARGS["sinkhorn_iterations"]):
        sum_of_rows = torch.sum(Q, dim=1, keepdim=True)
        dist.all_reduce(sum_of_rows)
        Q /= sum_of_rows
        Q /= K
        Q /= torch.sum(Q, dim=0, keepdim=True)
        Q /= B
    Q *= B
    return Q.t()


def main():
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(31)  # same init on every rank (DDP also broadcasts it)
    images, labels = make_images(512, seed=0)
    sampler = torch.utils.data.DistributedSampler(torch.utils.data.TensorDataset(images), shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images), batch_size=ARGS["batch_size"],
                                         sampler=sampler, drop_last=True)
    aug_gen = torch.Generator().manual_seed(1000 + rank)  # per-rank augmentation stream

    model = nn.parallel.DistributedDataParallel(SwAVNet(ARGS["feat_dim"], ARGS["nmb_prototypes"]))
    optimizer = torch.optim.SGD(model.parameters(), lr=ARGS["base_lr"], momentum=0.9, weight_decay=ARGS["wd"])
    iters = len(loader)
    warmup_lr = np.linspace(ARGS["start_warmup"], ARGS["base_lr"], iters * ARGS["warmup_epochs"])
    t = np.arange(iters * (ARGS["epochs"] - ARGS["warmup_epochs"]))
    cosine_lr = ARGS["final_lr"] + 0.5 * (ARGS["base_lr"] - ARGS["final_lr"]) * (1 + np.cos(math.pi * t / len(t)))
    lr_schedule = np.concatenate((warmup_lr, cosine_lr))

    queue_length = ARGS["queue_length"] - ARGS["queue_length"] % (ARGS["batch_size"] * world_size)
    queue, n_crops = None, sum(ARGS["nmb_crops"])
    for epoch in range(ARGS["epochs"]):
        sampler.set_epoch(epoch)
        if queue_length > 0 and epoch >= ARGS["epoch_queue_starts"] and queue is None:
            queue = torch.zeros(len(ARGS["crops_for_assign"]), queue_length // world_size, ARGS["feat_dim"])
        use_the_queue = False
        for it, (x,) in enumerate(loader):
            iteration = epoch * iters + it
            for param_group in optimizer.param_groups:
                param_group["lr"] = lr_schedule[iteration]
            inputs = multi_crop(x, aug_gen)
            with torch.no_grad():  # normalize the prototypes
                w = model.module.prototypes.weight.data.clone()
                w = nn.functional.normalize(w, dim=1, p=2)
                model.module.prototypes.weight.copy_(w)

            embedding, output = model(inputs)
            embedding = embedding.detach()
            bs = inputs[0].size(0)
            loss = 0
            for i, crop_id in enumerate(ARGS["crops_for_assign"]):
                with torch.no_grad():
                    out = output[bs * crop_id: bs * (crop_id + 1)].detach()
                    if queue is not None:
                        if use_the_queue or not torch.all(queue[i, -1, :] == 0):
                            use_the_queue = True
                            out = torch.cat((torch.mm(queue[i], model.module.prototypes.weight.t()), out))
                        queue[i, bs:] = queue[i, :-bs].clone()
                        queue[i, :bs] = embedding[crop_id * bs: (crop_id + 1) * bs]
                    q = distributed_sinkhorn(out, world_size)[-bs:]
                subloss = 0
                for v in np.delete(np.arange(n_crops), crop_id):
                    x_v = output[bs * v: bs * (v + 1)] / ARGS["temperature"]
                    subloss -= torch.mean(torch.sum(q * F.log_softmax(x_v, dim=1), dim=1))
                loss += subloss / (n_crops - 1)
            loss /= len(ARGS["crops_for_assign"])

            optimizer.zero_grad()
            loss.backward()
            if iteration < ARGS["freeze_prototypes_niters"]:  # cancel gradients for the prototypes
                for name, p in model.named_parameters():
                    if "prototypes" in name:
                        p.grad = None
            optimizer.step()
            if rank == 0 and iteration % 5 == 0:
                print(f"epoch {epoch} it {iteration:2d} loss {loss.item():.4f} lr {lr_schedule[iteration]:.4f} "
                      f"queue {'on' if use_the_queue else 'off'}")

    # weights are DDP-synchronised; queues are rank-local by design
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(world_size)]
    dist.all_gather(gathered, flat)
    qn = torch.tensor([queue.sum().item()])
    qs = [torch.zeros_like(qn) for _ in range(world_size)]
    dist.all_gather(qs, qn)
    if rank == 0:
        print(f"max |w_rank0 - w_rank1| = {(gathered[0] - gathered[1]).abs().max().item():.2e}; "
              f"queue sums per rank {[round(q.item(), 3) for q in qs]}")
        model.eval()
        with torch.no_grad():
            test_x, test_y = make_images(256, seed=5)
            _, logits = model.module([test_x[:, :, 2:18, 2:18]])
            assign = logits.argmax(1)
        purity = sum(torch.bincount(test_y[assign == k], minlength=8).max().item()
                     for k in assign.unique()) / len(test_y)
        print(f"prototype-assignment purity on held-out images: {purity:.3f} "
              f"({len(assign.unique())} prototypes used)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
