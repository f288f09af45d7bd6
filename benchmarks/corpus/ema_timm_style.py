"""A tiny vision transformer trained timm-style, with an exponential moving average of its weights.

Modelled on: timm's train.py with ModelEmaV3
(https://github.com/huggingface/pytorch-image-models/blob/main/train.py,
timm/utils/model_ema.py)
Habits reproduced: hand-written Attention/Mlp/Block modules with DropPath and LayerNorm, a
``deepcopy`` of the model kept in eval mode with ``requires_grad_(False)`` as the EMA, updated
after every optimizer step under ``torch.no_grad()`` (``lerp_`` on float tensors, ``copy_`` on
integer buffers, with a warmup-adjusted decay), AdamW on parameter groups that exempt biases
and norm weights from weight decay, cross entropy with label smoothing, ``clip_grad_norm_``,
a per-update warmup-then-cosine ``LambdaLR``, ``optimizer.zero_grad()`` after the step,
``validate()`` of both the model and its EMA every ``--eval-every`` updates under
``torch.no_grad()``, and a checkpoint holding both state dicts written and read back.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from copy import deepcopy

import torch
import torch.nn as nn
import torch.nn.functional as F


def drop_path(x, drop_prob: float = 0.0, training: bool = False):
    if drop_prob == 0.0 or not training:
        return x
    keep_prob = 1 - drop_prob
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)
    random_tensor = x.new_empty(shape).bernoulli_(keep_prob)
    return x * random_tensor.div_(keep_prob)


class DropPath(nn.Module):
    def __init__(self, drop_prob=0.0):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x):
        return drop_path(x, self.drop_prob, self.training)


class Attention(nn.Module):
    def __init__(self, dim, num_heads=2):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        x = F.scaled_dot_product_attention(q, k, v)
        x = x.transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


class Mlp(nn.Module):
    def __init__(self, in_features, hidden_features):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_features, in_features)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio=2.0, drop_path=0.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, num_heads=num_heads)
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.drop_path2 = DropPath(drop_path)

    def forward(self, x):
        x = x + self.drop_path1(self.attn(self.norm1(x)))
        x = x + self.drop_path2(self.mlp(self.norm2(x)))
        return x


class TinyViT(nn.Module):
    def __init__(self, img_size=16, patch_size=4, num_classes=10, embed_dim=32, depth=2, num_heads=2,
                 drop_path_rate=0.1):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, embed_dim, kernel_size=patch_size, stride=patch_size)
        num_patches = (img_size // patch_size) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches + 1, embed_dim))
        dpr = [x.item() for x in torch.linspace(0, drop_path_rate, depth)]
        self.blocks = nn.Sequential(*[Block(embed_dim, num_heads, drop_path=dpr[i]) for i in range(depth)])
        self.norm = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, num_classes)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)
        self.apply(self._init_weights)

    def _init_weights(self, m):
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = x + self.pos_embed
        x = self.blocks(x)
        x = self.norm(x)
        return self.head(x[:, 0])


class ModelEma(nn.Module):
    """Keeps a moving average of a model's weights; buffers that are not floats are copied."""

    def __init__(self, model, decay=0.9998, warmup=True):
        super().__init__()
        self.module = deepcopy(model)
        self.module.eval()
        self.module.requires_grad_(False)
        self.decay = decay
        self.use_warmup = warmup

    def get_decay(self, step):
        if not self.use_warmup:
            return self.decay
        return min(self.decay, 1.0 - (1.0 + step) ** -0.75)

    @torch.no_grad()
    def update(self, model, step):
        decay = self.get_decay(step)
        for ema_v, model_v in zip(self.module.state_dict().values(), model.state_dict().values()):
            if ema_v.is_floating_point():
                ema_v.lerp_(model_v, weight=1.0 - decay)
            else:
                ema_v.copy_(model_v)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def param_groups_weight_decay(model, weight_decay=1e-5, no_weight_decay_list=()):
    decay = []
    no_decay = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if param.ndim <= 1 or name.endswith(".bias") or name in no_weight_decay_list:
            no_decay.append(param)
        else:
            decay.append(param)
    return [
        {"params": no_decay, "weight_decay": 0.0},
        {"params": decay, "weight_decay": weight_decay},
    ]


def synthetic_images(n, seed):
    generator = torch.Generator().manual_seed(seed)
    templates = torch.randn(10, 3, 16, 16, generator=torch.Generator().manual_seed(7))
    target = torch.randint(0, 10, (n,), generator=generator)
    images = templates[target] + torch.randn(n, 3, 16, 16, generator=generator)
    return torch.utils.data.TensorDataset(images, target)


def validate(model, loader, log_suffix=""):
    model.eval()
    losses, top1, count = 0.0, 0.0, 0
    with torch.no_grad():
        for input, target in loader:
            output = model(input)
            losses += F.cross_entropy(output, target, reduction="sum").item()
            top1 += (output.argmax(-1) == target).float().sum().item()
            count += input.size(0)
    print(f"Test{log_suffix}: Loss {losses / count:.4f} Acc@1 {100.0 * top1 / count:.2f}")
    return {"loss": losses / count, "top1": 100.0 * top1 / count}


def main():
    parser = argparse.ArgumentParser(description="timm-style training with a model EMA")
    parser.add_argument("--steps", type=int, default=20, help="optimizer updates in total")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=0.05)
    parser.add_argument("--smoothing", type=float, default=0.1)
    parser.add_argument("--clip-grad", type=float, default=1.0)
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--model-ema-decay", type=float, default=0.99)
    parser.add_argument("--eval-every", type=int, default=4, help="updates between validations")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    model = TinyViT()
    print(f"Model created, param count: {sum(m.numel() for m in model.parameters())}")
    model_ema = ModelEma(model, decay=args.model_ema_decay)

    optimizer = torch.optim.AdamW(
        param_groups_weight_decay(model, args.weight_decay, no_weight_decay_list={"pos_embed", "cls_token"}),
        lr=args.lr)

    def lr_lambda(update):
        if update < args.warmup_steps:
            return (update + 1) / args.warmup_steps
        progress = (update - args.warmup_steps) / max(1, args.steps - args.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    train_loss_fn = nn.CrossEntropyLoss(label_smoothing=args.smoothing)

    loader_train = torch.utils.data.DataLoader(
        synthetic_images(args.batch_size * 4, args.seed), batch_size=args.batch_size, shuffle=True, drop_last=True)
    loader_eval = torch.utils.data.DataLoader(synthetic_images(32, args.seed + 1), batch_size=32)

    output_dir = tempfile.TemporaryDirectory()
    num_updates = 0
    best_metric = None
    epoch = 0
    while num_updates < args.steps:
        model.train()
        end = time.time()
        for batch_idx, (input, target) in enumerate(loader_train):
            if num_updates >= args.steps:
                break
            output = model(input)
            loss = train_loss_fn(output, target)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad)
            optimizer.step()
            optimizer.zero_grad()
            num_updates += 1
            model_ema.update(model, step=num_updates)
            lr_scheduler.step()

            batch_time = time.time() - end
            lrl = [param_group["lr"] for param_group in optimizer.param_groups]
            print(f"Train: {epoch} [{batch_idx}/{len(loader_train)}] Loss: {loss.item():#.3g} "
                  f"Time: {batch_time:.3f}s LR: {sum(lrl) / len(lrl):.3e}")
            end = time.time()

            if num_updates % args.eval_every == 0 or num_updates == args.steps:
                validate(model, loader_eval)
                ema_metrics = validate(model_ema, loader_eval, log_suffix=" (EMA)")
                model.train()
                if best_metric is None or ema_metrics["top1"] > best_metric:
                    best_metric = ema_metrics["top1"]
                    torch.save({"state_dict": model.state_dict(), "state_dict_ema": model_ema.module.state_dict(),
                                "optimizer": optimizer.state_dict(), "num_updates": num_updates},
                               os.path.join(output_dir.name, "model_best.pth.tar"))
        epoch += 1

    checkpoint = torch.load(os.path.join(output_dir.name, "model_best.pth.tar"), map_location="cpu")
    model_ema.module.load_state_dict(checkpoint["state_dict_ema"])
    print(f"*** Best metric: {best_metric} (update {checkpoint['num_updates']})")
    output_dir.cleanup()


if __name__ == "__main__":
    main()
