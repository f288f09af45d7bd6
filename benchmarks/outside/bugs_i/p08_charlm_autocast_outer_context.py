"""Character-level transformer LM: fp32 warm-up, then bf16 autocast for the rest of the run.

Modelled on: pytorch/pytorch#120376 "Stochastic rounding in bfloat16" -- in that thread the
"fp32 -> bf16 autocast" run had a far worse loss curve than pure bf16, and the cause turned out
to be (comment by kenjiqq) "running the whole training loop inside the autocast context.  If you
move it to only wrap the forward pass ... you get much better results".  Autocast caches the
low-precision copies of fp32 leaf weights until the outermost autocast region exits, so with the
loop inside one region every forward after the first reuses the bf16 weights cast before the
optimizer updated them.  (Same mechanism as X-GenGroup-style "stale weight cache" reports.)

What is unusual about the loop: mixed precision is switched on mid-run (``--amp-from``): the
first steps run in fp32, then the remaining steps run under CPU bf16 autocast.  The first bf16
step is still correct (it fills the cache); every later step computes its forward and gradients
at stale weights.  ``--healthy`` opens the autocast region around each forward + loss only.
"""
import argparse
import contextlib
import math
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)


def make_corpus(n_sentences=1500, seed=0):
    rnd = random.Random(seed)
    subj = ["the cat", "a dog", "my friend", "the old man", "our teacher", "a small bird"]
    verb = ["sees", "likes", "finds", "follows", "calls", "helps"]
    obj = ["the ball", "a red car", "the river", "his book", "the garden", "a green tree"]
    return " ".join(f"{rnd.choice(subj)} {rnd.choice(verb)} {rnd.choice(obj)}." for _ in range(n_sentences))


class CausalSelfAttention(nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, n_head)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class CharTransformer(nn.Module):
    def __init__(self, vocab, block_size, d=64, n_layer=2, n_head=4):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(block_size, d)
        self.blocks = nn.ModuleList(Block(d, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1])
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.lm_head(self.ln_f(x))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--healthy", action="store_true")
    p.add_argument("--max-iters", type=int, default=40)
    p.add_argument("--amp-from", type=int, default=12)
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    args = p.parse_args()

    torch.manual_seed(0)
    text = make_corpus()
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text])
    n = int(0.9 * len(data))
    train_data, val_data = data[:n], data[n:]
    gen = torch.Generator().manual_seed(0)

    def get_batch(split):
        src = train_data if split == "train" else val_data
        ix = torch.randint(len(src) - args.block_size - 1, (args.batch_size,), generator=gen)
        x = torch.stack([src[i:i + args.block_size] for i in ix])
        y = torch.stack([src[i + 1:i + 1 + args.block_size] for i in ix])
        return x, y

    model = CharTransformer(len(chars), args.block_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    probe, _ = get_batch("val")
    bf16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731

    def train_step(it, fwd_ctx):
        x, y = get_batch("train")
        with fwd_ctx():
            logits = model(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), y.view(-1))
            probe_logits = model(probe).detach().float()  # what the model "sees" right now
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if it % 5 == 0:
            print(f"iter {it:3d} loss {loss.item():.4f}")
        return probe_logits

    for it in range(args.amp_from):  # fp32 warm-up
        train_step(it, contextlib.nullcontext)

    print(f"-- switching to bf16 autocast at iter {args.amp_from} --")
    w0 = torch.cat([p_.detach().flatten().clone() for p_ in model.parameters()])
    seen = []
    if args.healthy:
        for it in range(args.amp_from, args.max_iters):
            seen.append(train_step(it, bf16))
    else:
        print(f"ONSET step {args.amp_from + 1}")
        with bf16():
            for it in range(args.amp_from, args.max_iters):
                seen.append(train_step(it, contextlib.nullcontext))

    w1 = torch.cat([p_.detach().flatten() for p_ in model.parameters()])
    model.eval()
    with torch.no_grad(), bf16():
        xv, yv = get_batch("val")
        lv = model(xv)
        val_loss = F.cross_entropy(lv.view(-1, lv.size(-1)).float(), yv.view(-1)).item()
    print(f"EVIDENCE weights moved {(w1 - w0).norm().item():.4f} during bf16 phase; in-loop probe logits "
          f"changed {(seen[-1] - seen[0]).abs().max().item():.4f}; fresh val loss {val_loss:.4f} "
          f"(uniform {math.log(len(chars)):.4f})")


if __name__ == "__main__":
    main()
