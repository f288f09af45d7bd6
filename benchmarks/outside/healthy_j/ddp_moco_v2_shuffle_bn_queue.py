"""MoCo v2 self-supervised pre-training with DDP on 2 gloo ranks (tiny CNN, synthetic images).

Modelled on: facebookresearch/moco (``moco/builder.py`` and ``main_moco.py``; He et al.,
"Momentum Contrast for Unsupervised Visual Representation Learning", and the MoCo v2
recipe: MLP head, T=0.2, cosine lr).  The ``MoCo`` module has a query encoder trained by
SGD, a key encoder that is a momentum copy (``requires_grad = False``), a ``queue``
buffer of negative keys filled through ``concat_all_gather``, and "shuffle BN":
``_batch_shuffle_ddp`` gathers the key batch from all ranks, permutes it with an index
drawn on rank 0 and broadcast, and ``_batch_unshuffle_ddp`` undoes it.  The whole MoCo
module is wrapped in DDP, as in ``main_moco.py``.

What is unusual about the loop:
  * Half of the model (``encoder_k``) is never touched by the optimizer: it moves only
    through ``param_k = m * param_k + (1 - m) * param_q`` under ``no_grad``.
  * The ``queue`` buffer is overwritten in place inside ``forward`` every step; the
    cross-entropy target is always class 0 (the positive key).
  * Each rank augments its images with its own generator (seed + rank), so the two
    ranks see different crops/flips/noise of their shards on purpose.
  * The key batch is exchanged between ranks before the key encoder runs (shuffle BN),
    so the BN statistics of a rank's key forward come from a mix of both ranks' images.
  * The learning rate follows MoCo's ``adjust_learning_rate`` (cosine, set by hand).
  * Rank 0 alone runs a kNN probe on the query encoder while rank 1 waits at a barrier.
"""
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

torch.set_num_threads(1)


def base_encoder(num_classes=32):
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, num_classes)),  # v2 MLP head
    )


@torch.no_grad()
def concat_all_gather(tensor):
    tensors_gather = [torch.ones_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(tensors_gather, tensor, async_op=False)
    return torch.cat(tensors_gather, dim=0)


class MoCo(nn.Module):
    def __init__(self, dim=32, K=256, m=0.99, T=0.2):
        super().__init__()
        self.K, self.m, self.T = K, m, T
        self.encoder_q = base_encoder(num_classes=dim)
        self.encoder_k = base_encoder(num_classes=dim)
        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            param_k.data.copy_(param_q.data)
            param_k.requires_grad = False
        self.register_buffer("queue", F.normalize(torch.randn(dim, K), dim=0))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def _momentum_update_key_encoder(self):
        for param_q, param_k in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            param_k.mul_(self.m).add_(param_q.detach(), alpha=1.0 - self.m)

    @torch.no_grad()
    def _dequeue_and_enqueue(self, keys):
        keys = concat_all_gather(keys)
        batch_size = keys.shape[0]
        ptr = int(self.queue_ptr)
        assert self.K % batch_size == 0
        self.queue[:, ptr:ptr + batch_size] = keys.T
        self.queue_ptr[0] = (ptr + batch_size) % self.K

    @torch.no_grad()
    def _batch_shuffle_ddp(self, x):
        batch_size_this = x.shape[0]
        x_gather = concat_all_gather(x)
        num_ranks = x_gather.shape[0] // batch_size_this
        idx_shuffle = torch.randperm(x_gather.shape[0])
        dist.broadcast(idx_shuffle, src=0)       # every rank uses rank 0's permutation
        idx_unshuffle = torch.argsort(idx_shuffle)
        idx_this = idx_shuffle.view(num_ranks, -1)[dist.get_rank()]
        return x_gather[idx_this], idx_unshuffle

    @torch.no_grad()
    def _batch_unshuffle_ddp(self, x, idx_unshuffle):
        batch_size_this = x.shape[0]
        x_gather = concat_all_gather(x)
        num_ranks = x_gather.shape[0] // batch_size_this
        return x_gather[idx_unshuffle.view(num_ranks, -1)[dist.get_rank()]]

    def forward(self, im_q, im_k):
        q = F.normalize(self.encoder_q(im_q), dim=1)
        with torch.no_grad():
            self._momentum_update_key_encoder()
            im_k, idx_unshuffle = self._batch_shuffle_ddp(im_k)
            k = F.normalize(self.encoder_k(im_k), dim=1)
            k = self._batch_unshuffle_ddp(k, idx_unshuffle)
        l_pos = torch.einsum("nc,nc->n", q, k).unsqueeze(-1)
        l_neg = torch.einsum("nc,ck->nk", q, self.queue.clone().detach())
        logits = torch.cat([l_pos, l_neg], dim=1) / self.T
        labels = torch.zeros(logits.shape[0], dtype=torch.long)
        self._dequeue_and_enqueue(k)
        return logits, labels


def make_images(n, seed):
    """Six classes of 16x16 images: stripes at six orientations, random phase, colour, noise."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 6, (n,), generator=g)
    yy, xx = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    theta = y.float() * math.pi / 6
    phase = 2 * math.pi * torch.rand(n, generator=g)
    proj = torch.cos(theta)[:, None, None] * xx + torch.sin(theta)[:, None, None] * yy
    stripes = torch.sin(1.2 * proj + phase[:, None, None])
    colour = 0.5 + torch.rand(n, 3, 1, 1, generator=g)
    x = stripes.unsqueeze(1) * colour + 0.8 * torch.randn(n, 3, 16, 16, generator=g)
    return x, y


def augment(x, g):
    """Random shift (pad + crop), horizontal flip, brightness jitter, gaussian noise."""
    n = x.shape[0]
    padded = F.pad(x, (2, 2, 2, 2), mode="reflect")
    dx, dy = torch.randint(0, 5, (2, n), generator=g)
    out = torch.stack([padded[i, :, dy[i]:dy[i] + 16, dx[i]:dx[i] + 16] for i in range(n)])
    flip = torch.rand(n, generator=g) < 0.5
    out[flip] = out[flip].flip(-1)
    out = out * (0.6 + 0.8 * torch.rand(n, 1, 1, 1, generator=g))
    return out + 0.1 * torch.randn(out.shape, generator=g)


def adjust_learning_rate(optimizer, step, total_steps, base_lr):
    lr = base_lr * 0.5 * (1.0 + math.cos(math.pi * step / total_steps))
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    return lr


@torch.no_grad()
def knn_probe(encoder, x_bank, y_bank, x_test, y_test, k=10):
    encoder.eval()
    fb = F.normalize(encoder(x_bank), dim=1)
    ft = F.normalize(encoder(x_test), dim=1)
    idx = (ft @ fb.T).topk(k, dim=1).indices
    pred = torch.mode(y_bank[idx], dim=1).values
    encoder.train()
    return (pred == y_test).float().mean().item()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    x_train, y_train = make_images(1536, seed=1)
    sampler = DistributedSampler(TensorDataset(x_train), num_replicas=world, rank=rank, seed=0)
    loader = DataLoader(TensorDataset(x_train), batch_size=32, sampler=sampler, drop_last=True)

    model = DDP(MoCo(dim=32, K=256, m=0.99, T=0.2))
    base_lr, total_steps = 0.06, 48
    optimizer = torch.optim.SGD(model.parameters(), lr=base_lr, momentum=0.9, weight_decay=1e-4)
    criterion = nn.CrossEntropyLoss()
    aug_gen = torch.Generator().manual_seed(100 + rank)   # per-rank augmentation stream
    x_test, y_test = make_images(256, seed=2)

    if rank == 0:
        print(f"kNN acc at init {knn_probe(model.module.encoder_q, x_train[:512], y_train[:512], x_test, y_test):.3f}")
    dist.barrier()

    step, epoch = 0, 0
    while step < total_steps:
        sampler.set_epoch(epoch)
        for (images,) in loader:
            lr = adjust_learning_rate(optimizer, step, total_steps, base_lr)
            im_q, im_k = augment(images, aug_gen), augment(images, aug_gen)
            output, target = model(im_q, im_k)
            loss = criterion(output, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % 12 == 0:
                acc1 = (output.argmax(1) == target).float().mean()
                stats = torch.stack([loss.detach(), acc1])
                dist.all_reduce(stats)
                stats /= world
                if rank == 0:
                    knn = knn_probe(model.module.encoder_q, x_train[:512], y_train[:512], x_test, y_test)
                    print(f"step {step:3d} lr {lr:.4f} loss {stats[0]:.4f} "
                          f"instance-acc {stats[1]:.3f} queue_ptr {int(model.module.queue_ptr)} kNN {knn:.3f}")
                dist.barrier()
            if step >= total_steps:
                break
        epoch += 1

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
