"""DeiT-style ViT training with DDP (2 gloo ranks), repeated-augmentation sampler, mixup and model EMA.

Modelled on: facebookresearch/deit (``samplers.py``: ``RASampler`` repeats every index
``num_repeats`` = 3 times with ``repeat_interleave`` and deals the copies round-robin to the ranks,
so each rank sees the *same* images as the others under its *own* augmentation, and yields only
``floor(len // 256 * 256 / world_size)`` indices per epoch; ``main.py``: ``seed = args.seed +
utils.get_rank()``, ``linear_scaled_lr = lr * batch_size * world_size / 512``, AdamW without weight
decay on norm/bias/pos_embed/cls_token, warm-up + cosine stepped per epoch, ``drop_path``, timm
``Mixup`` with label smoothing and ``SoftTargetCrossEntropy``, timm ``ModelEma``, ``dist_eval``
with ``DistributedSampler`` and all-reduced metrics, ``save_on_master``; ``engine.py``:
``train_one_epoch`` under autocast, ``model_ema.update(model)`` after every step).

Unusual but correct: the two ranks seed their RNGs with ``seed + rank``, so their initial weights
differ until the DDP constructor broadcasts rank 0's parameters; after that the weights stay
identical, while the augmentation (crop/flip), the mixup lambda and the drop-path masks differ per
rank on purpose; every image appears 3 times per epoch across the ranks; the EMA copy is created from
the DDP-synchronised weights so it is the same on both ranks; the forward runs under CPU bf16
autocast. Launch: python -m torch.distributed.run --standalone --nproc-per-node 2 THIS_FILE.py
"""
import copy
import math
import os
import tempfile

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

torch.set_num_threads(1)

N_CLASSES, IMG = 10, 16


class RASampler(torch.utils.data.Sampler):
    def __init__(self, dataset, num_replicas, rank, shuffle=True, num_repeats=3):
        self.dataset, self.num_replicas, self.rank = dataset, num_replicas, rank
        self.epoch, self.num_repeats, self.shuffle = 0, num_repeats, shuffle
        self.num_samples = int(math.ceil(len(dataset) * float(num_repeats) / num_replicas))
        self.total_size = self.num_samples * num_replicas
        self.num_selected_samples = int(math.floor(len(dataset) // 256 * 256 / num_replicas))

    def __iter__(self):
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.epoch)
            indices = torch.randperm(len(self.dataset), generator=g)
        else:
            indices = torch.arange(len(self.dataset))
        indices = torch.repeat_interleave(indices, repeats=self.num_repeats, dim=0).tolist()
        padding_size = self.total_size - len(indices)
        if padding_size > 0:
            indices += indices[:padding_size]
        indices = indices[self.rank:self.total_size:self.num_replicas]
        return iter(indices[:self.num_selected_samples])

    def __len__(self):
        return self.num_selected_samples

    def set_epoch(self, epoch):
        self.epoch = epoch


class AugmentedImages(torch.utils.data.Dataset):
    """Random crop (pad 2) + horizontal flip, drawn from the process RNG (seeded with seed + rank)."""

    def __init__(self, x, y, train):
        self.x, self.y, self.train = x, y, train

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        img = self.x[i]
        if self.train:
            img = F.pad(img, (2, 2, 2, 2), mode="reflect")
            dy, dx = np.random.randint(0, 5, size=2)
            img = img[:, dy:dy + IMG, dx:dx + IMG]
            if np.random.rand() < 0.5:
                img = img.flip(2)
        return img, self.y[i]


def drop_path(x, drop_prob, training):
    if drop_prob == 0.0 or not training:
        return x
    keep = 1 - drop_prob
    mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
    return x * mask / keep


class Block(nn.Module):
    def __init__(self, dim, heads, dpr):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.dpr = dpr

    def forward(self, x):
        h = self.norm1(x)
        x = x + drop_path(self.attn(h, h, h, need_weights=False)[0], self.dpr, self.training)
        return x + drop_path(self.mlp(self.norm2(x)), self.dpr, self.training)


class TinyViT(nn.Module):
    def __init__(self, dim=64, depth=3, heads=4, patch=4, drop_path_rate=0.1):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, stride=patch)
        n = (IMG // patch) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, n + 1, dim))
        dpr = [r.item() for r in torch.linspace(0, drop_path_rate, depth)]
        self.blocks = nn.ModuleList([Block(dim, heads, d) for d in dpr])
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, N_CLASSES)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], 1) + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)[:, 0])


class ModelEma:
    def __init__(self, model, decay):
        self.ema = copy.deepcopy(model).eval()
        self.decay = decay
        for p in self.ema.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def update(self, model):
        msd = model.state_dict()
        for k, ema_v in self.ema.state_dict().items():
            ema_v.copy_(ema_v * self.decay + (1.0 - self.decay) * msd[k])


def mixup(x, y, alpha=0.8, smoothing=0.1):
    lam = float(np.random.beta(alpha, alpha))          # per-rank numpy RNG, as timm's Mixup
    off, on = smoothing / N_CLASSES, 1.0 - smoothing + smoothing / N_CLASSES
    y1 = torch.full((len(y), N_CLASSES), off).scatter_(1, y[:, None], on)
    return x.mul(lam).add_(x.flip(0).mul_(1.0 - lam)), y1 * lam + y1.flip(0) * (1.0 - lam)


@torch.no_grad()
def evaluate(model, loader):
    model.eval()
    correct = torch.zeros(2)
    for x, y in loader:
        correct += torch.tensor([(model(x).argmax(1) == y).sum().item(), len(y)], dtype=torch.float)
    dist.all_reduce(correct)
    return (correct[0] / correct[1]).item()


def make_data(n, seed):
    g = np.random.default_rng(seed)
    protos = np.random.default_rng(100).normal(0, 1, (N_CLASSES, 3, 4, 4))
    protos = np.kron(protos, np.ones((1, 1, 4, 4)))     # blocky class patterns
    y = g.integers(0, N_CLASSES, n)
    x = protos[y] + 0.8 * g.standard_normal((n, 3, IMG, IMG))
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y)


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    seed = 0 + rank
    torch.manual_seed(seed)
    np.random.seed(seed)

    train_set = AugmentedImages(*make_data(512, 1), train=True)
    val_set = AugmentedImages(*make_data(256, 2), train=False)
    sampler_train = RASampler(train_set, num_replicas=world, rank=rank, shuffle=True)
    batch_size, epochs, warmup_epochs = 32, 4, 1
    train_loader = torch.utils.data.DataLoader(train_set, sampler=sampler_train, batch_size=batch_size, drop_last=True)
    val_loader = torch.utils.data.DataLoader(
        val_set, sampler=torch.utils.data.DistributedSampler(val_set, shuffle=False), batch_size=128)

    model = TinyViT()
    local_init = model.head.weight.detach().clone()
    model = DDP(model)                                  # broadcasts rank 0's weights
    model_without_ddp = model.module
    model_ema = ModelEma(model_without_ddp, decay=0.9)   # short run: small decay
    same = torch.equal(local_init, model_without_ddp.head.weight.detach())
    print(f"[rank {rank}] local init kept after DDP broadcast: {same}")

    lr = 8e-3 * batch_size * world / 512.0
    skip = ("cls_token", "pos_embed")
    decay = [p for n, p in model_without_ddp.named_parameters() if p.ndim > 1 and not n.endswith(skip)]
    no_decay = [p for n, p in model_without_ddp.named_parameters() if p.ndim <= 1 or n.endswith(skip)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=lr)
    lr_lambda = lambda e: (e + 1) / (warmup_epochs + 1) if e < warmup_epochs else \
        0.5 * (1 + math.cos(math.pi * (e - warmup_epochs) / (epochs - warmup_epochs)))
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)

    step = 0
    for epoch in range(epochs):
        sampler_train.set_epoch(epoch)
        model.train()
        for samples, targets in train_loader:
            samples, soft = mixup(samples, targets)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                outputs = model(samples)
            loss = torch.sum(-soft * F.log_softmax(outputs.float(), dim=-1), dim=-1).mean()
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            model_ema.update(model_without_ddp)
            step += 1
        lr_scheduler.step()
        acc = evaluate(model, val_loader)
        if rank == 0:
            print(f"epoch {epoch}: steps {step}, lr {optimizer.param_groups[0]['lr']:.2e}, "
                  f"loss {loss.item():.3f}, val acc {acc:.3f}")

    acc_ema = evaluate(model_ema.ema, val_loader)
    # the EMA weights must agree across ranks (they are built from synchronised weights)
    w = model_ema.ema.head.weight.detach().clone()
    w0 = w.clone()
    dist.broadcast(w0, 0)
    assert torch.allclose(w, w0), "EMA differs across ranks"

    # save_on_master, then reload the EMA weights on rank 0 and re-evaluate
    ckpt_dir = [tempfile.mkdtemp() if rank == 0 else None]
    dist.broadcast_object_list(ckpt_dir, src=0)
    path = os.path.join(ckpt_dir[0], "checkpoint.pth")
    if rank == 0:
        torch.save({"model": model_without_ddp.state_dict(), "optimizer": optimizer.state_dict(),
                    "lr_scheduler": lr_scheduler.state_dict(), "epoch": epochs,
                    "model_ema": model_ema.ema.state_dict()}, path)
    dist.barrier()
    restored = TinyViT()
    restored.load_state_dict(torch.load(path)["model_ema"])
    acc_restored = evaluate(restored, val_loader)
    if rank == 0:
        print(f"EMA val acc {acc_ema:.3f}, restored EMA val acc {acc_restored:.3f}")
    dist.barrier()
    if rank == 0:
        os.remove(path)
        os.rmdir(ckpt_dir[0])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
