"""Tiny ViT image classifier trained with the Swin-Transformer training recipe: AdamW with
no weight decay on norms/biases/position embeddings, label-smoothing cross entropy,
gradient clipping, and a per-iteration cosine schedule with linear warm-up driven by
``lr_scheduler.step_update(epoch * num_steps + idx)``.

Modelled on: microsoft/Swin-Transformer issue #277 "Wrong lr scheduling curve caused by using
timm" (fixed by PR #278): ``build_scheduler`` created timm's ``CosineLRScheduler`` with
``t_initial=num_steps`` and ``warmup_t=warmup_steps`` but without ``warmup_prefix``, so the
cosine curve already decays during the warm-up iterations and the learning rate drops
abruptly when warm-up hands over to cosine.  The fix sets ``warmup_prefix=True`` and
``t_initial=num_steps - warmup_steps``.  timm is not installed here, so its scheduler
(``_get_lr`` / ``step_update``) is vendored below, as some projects do.

Unusual about the loop: the scheduler is stepped with the global iteration index after
``optimizer.step()`` (so iteration t trains with the lr computed for t-1), two parameter
groups (decay / no decay), epoch-wise shuffling with a seeded generator.
Run: python p02_swin_style_vit_cosine_warmup_prefix.py [--healthy]
"""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
parser = argparse.ArgumentParser()
parser.add_argument("--healthy", action="store_true")
args = parser.parse_args()
torch.manual_seed(0)

EPOCHS, WARMUP_EPOCHS, BATCH, BASE_LR, MIN_LR, WARMUP_LR = 4, 1, 32, 5e-4, 5e-6, 5e-7


class CosineLRScheduler:
    """Minimal copy of timm.scheduler.CosineLRScheduler (t_in_epochs=False path)."""

    def __init__(self, optimizer, t_initial, lr_min, warmup_lr_init, warmup_t, cycle_limit=1, warmup_prefix=False):
        self.optimizer, self.t_initial, self.lr_min = optimizer, t_initial, lr_min
        self.warmup_t, self.warmup_lr_init, self.cycle_limit, self.warmup_prefix = warmup_t, warmup_lr_init, cycle_limit, warmup_prefix
        self.base_values = [g["lr"] for g in optimizer.param_groups]
        self.warmup_steps = [(v - warmup_lr_init) / warmup_t for v in self.base_values]
        for g in optimizer.param_groups:
            g["lr"] = warmup_lr_init

    def _get_lr(self, t):
        if t < self.warmup_t:
            return [self.warmup_lr_init + t * s for s in self.warmup_steps]
        if self.warmup_prefix:
            t = t - self.warmup_t
        i, t_curr = t // self.t_initial, t % self.t_initial
        if i < self.cycle_limit:
            return [self.lr_min + 0.5 * (v - self.lr_min) * (1 + math.cos(math.pi * t_curr / self.t_initial)) for v in self.base_values]
        return [self.lr_min for _ in self.base_values]

    def step_update(self, num_updates):
        for g, lr in zip(self.optimizer.param_groups, self._get_lr(num_updates)):
            g["lr"] = lr


def build_scheduler(optimizer, n_iter_per_epoch):
    num_steps = EPOCHS * n_iter_per_epoch
    warmup_steps = WARMUP_EPOCHS * n_iter_per_epoch
    if args.healthy:  # fix of PR #278
        return CosineLRScheduler(optimizer, t_initial=num_steps - warmup_steps, lr_min=MIN_LR,
                                 warmup_lr_init=WARMUP_LR, warmup_t=warmup_steps, warmup_prefix=True)
    return CosineLRScheduler(optimizer, t_initial=num_steps, lr_min=MIN_LR,
                             warmup_lr_init=WARMUP_LR, warmup_t=warmup_steps)


class TinyViT(nn.Module):
    def __init__(self, num_classes=4, dim=64, depth=2, patch=8):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        self.absolute_pos_embed = nn.Parameter(torch.zeros(1, 16, dim))
        nn.init.trunc_normal_(self.absolute_pos_embed, std=0.02)
        layer = nn.TransformerEncoderLayer(dim, 4, dim * 2, dropout=0.1, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2) + self.absolute_pos_embed
        return self.head(self.norm(self.blocks(x)).mean(1))


def set_weight_decay(model, skip_list=("absolute_pos_embed",)):
    has_decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim == 1 or name.endswith(".bias") or name in skip_list else has_decay).append(p)
    return [{"params": has_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_data(n, g):
    y = torch.randint(0, 4, (n,), generator=g)
    x = torch.randn(n, 3, 32, 32, generator=g) * 0.5
    xs = torch.arange(32).float()
    for k in range(4):  # class-dependent oriented stripes
        m = y == k
        ang = k * math.pi / 4
        stripes = torch.sin((xs[None, :] * math.cos(ang) + xs[:, None] * math.sin(ang)) * 0.6)
        x[m] += stripes
    return x, y


g = torch.Generator().manual_seed(1)
train_x, train_y = make_data(320, g)
val_x, val_y = make_data(128, g)
n_iter_per_epoch = len(train_x) // BATCH

model = TinyViT()
optimizer = torch.optim.AdamW(set_weight_decay(model), lr=BASE_LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05)
lr_scheduler = build_scheduler(optimizer, n_iter_per_epoch)
criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
warmup_steps = WARMUP_EPOCHS * n_iter_per_epoch

step, post_warmup_lrs, lr_at_handoff = 0, [], None
shuffle_g = torch.Generator().manual_seed(2)
for epoch in range(EPOCHS):
    model.train()
    perm = torch.randperm(len(train_x), generator=shuffle_g)
    for idx in range(n_iter_per_epoch):
        b = perm[idx * BATCH:(idx + 1) * BATCH]
        lr_now = optimizer.param_groups[0]["lr"]
        if step == warmup_steps + 1:
            lr_at_handoff = lr_now
            if not args.healthy:
                print(f"ONSET step {step}")
        if step > warmup_steps:
            post_warmup_lrs.append(lr_now)
        loss = criterion(model(train_x[b]), train_y[b])
        optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        optimizer.step()
        lr_scheduler.step_update(epoch * n_iter_per_epoch + idx)
        print(f"epoch {epoch} step {step} lr {lr_now:.3e} loss {loss.item():.4f} grad_norm {grad_norm:.3f}")
        step += 1
    model.eval()
    with torch.no_grad():
        acc = (model(val_x).argmax(1) == val_y).float().mean().item()
    print(f"epoch {epoch} val_acc {acc:.3f}")

print(f"EVIDENCE lr at first post-warm-up step {lr_at_handoff:.3e} (peak {BASE_LR:.1e}); "
      f"mean lr over post-warm-up steps {sum(post_warmup_lrs) / len(post_warmup_lrs):.3e}; final val_acc {acc:.3f}")
