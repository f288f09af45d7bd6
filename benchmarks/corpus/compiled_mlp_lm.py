"""A torch.compile'd MLP character language model trained with a nanoGPT-style loop.

Modelled on: karpathy/nanoGPT train.py (its ``compile = True`` path) with the MLP
language model of karpathy/makemore.  Habits reproduced: ``unoptimized_model = model;
model = torch.compile(model)``; batches drawn by ``get_batch(split)`` with random offsets
into a token stream; an ``@torch.no_grad()`` ``estimate_loss()`` that switches to
``model.eval()`` and back; a hand-written warm-up + cosine ``get_lr(it)`` written into
every ``param_group['lr']``; AdamW with decay only on parameters of ``dim() >= 2``;
``clip_grad_norm_``; ``optimizer.zero_grad(set_to_none=True)``; ``loss.item()`` logged
every few iterations; a checkpoint of the uncompiled model's ``state_dict`` written when
the validation loss improves.
"""

import argparse
import math
import os
import tempfile

import torch
import torch.nn as nn
from torch.nn import functional as F

VOCAB, BLOCK = 27, 4


class MLPLM(nn.Module):
    def __init__(self, n_embd=16, n_hidden=64):
        super().__init__()
        self.wte = nn.Embedding(VOCAB + 1, n_embd)  # the extra token pads the context at the start
        self.mlp = nn.Sequential(nn.Linear(BLOCK * n_embd, n_hidden), nn.Tanh(), nn.Linear(n_hidden, VOCAB))

    def forward(self, idx, targets=None):
        emb = self.wte(idx).flatten(1)
        logits = self.mlp(emb)
        loss = None if targets is None else F.cross_entropy(logits, targets)
        return logits, loss


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50, help="max_iters")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--eval-interval", type=int, default=4)
    parser.add_argument("--eval-iters", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--no-compile", action="store_true", help="run eagerly")
    args = parser.parse_args()

    learning_rate, min_lr, warmup_iters = 1e-2, 1e-3, 2
    lr_decay_iters = args.steps
    torch.manual_seed(args.seed)

    # a stream of "words": random letters separated by the end token 0, split 90/10
    g = torch.Generator().manual_seed(args.seed)
    letters = torch.randint(1, VOCAB, (4000,), generator=g)
    ends = torch.rand(4000, generator=g) < 0.2
    data = torch.where(ends, torch.zeros_like(letters), letters)
    n = int(0.9 * len(data))
    train_data, val_data = data[:n], data[n:]

    def get_batch(split):
        source = train_data if split == "train" else val_data
        ix = torch.randint(len(source) - BLOCK - 1, (args.batch_size,))
        x = torch.stack([source[i:i + BLOCK] for i in ix])
        y = source[ix + BLOCK]
        return x, y

    model = MLPLM()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=learning_rate, betas=(0.9, 0.99))
    if not args.no_compile:
        print("compiling the model...")
        unoptimized_model = model
        model = torch.compile(model)
    else:
        unoptimized_model = model

    @torch.no_grad()
    def estimate_loss():
        out = {}
        model.eval()
        for split in ["train", "val"]:
            losses = torch.zeros(args.eval_iters)
            for k in range(args.eval_iters):
                X, Y = get_batch(split)
                _, loss = model(X, Y)
                losses[k] = loss.item()
            out[split] = losses.mean()
        model.train()
        return out

    def get_lr(it):
        if it < warmup_iters:
            return learning_rate * (it + 1) / (warmup_iters + 1)
        if it > lr_decay_iters:
            return min_lr
        decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
        coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
        return min_lr + coeff * (learning_rate - min_lr)

    best_val_loss = 1e9
    with tempfile.TemporaryDirectory() as out_dir:
        X, Y = get_batch("train")
        for iter_num in range(args.steps):
            lr = get_lr(iter_num)
            for param_group in optimizer.param_groups:
                param_group["lr"] = lr

            if iter_num % args.eval_interval == 0 and iter_num > 0:
                losses = estimate_loss()
                print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
                if losses["val"] < best_val_loss:
                    best_val_loss = losses["val"]
                    checkpoint = {"model": unoptimized_model.state_dict(), "optimizer": optimizer.state_dict(),
                                  "iter_num": iter_num, "best_val_loss": best_val_loss}
                    torch.save(checkpoint, os.path.join(out_dir, "ckpt.pt"))

            _, loss = model(X, Y)
            X, Y = get_batch("train")  # prefetch the next batch, as nanoGPT does
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if iter_num % 2 == 0:
                print(f"iter {iter_num}: loss {loss.item():.4f}, lr {lr:.2e}")


if __name__ == "__main__":
    main()
