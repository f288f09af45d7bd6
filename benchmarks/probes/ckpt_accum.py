"""Healthy probe: a pre-LayerNorm transformer language model whose block stack runs under non-reentrant activation checkpointing (torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False), as in torchtitan and in Hugging Face models with gradient_checkpointing_kwargs={"use_reentrant": False}), applied only while training, with attention, residual and MLP dropout; gradient accumulation over 4 micro-batches in nanoGPT's order (loss / accum backward per micro-batch, clip_grad_norm_, step, then zero_grad(set_to_none=True) after the step only).

Checkpointing recomputes each block's forward during backward with the dropout masks
restored from the saved RNG state, so gradients equal those of the plain model.
"""
import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, d, heads, p):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, dropout=p, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(p))
        self.resid_drop = nn.Dropout(p)

    def forward(self, x):
        T = x.size(1)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        h = self.ln1(x)
        x = x + self.resid_drop(self.attn(h, h, h, attn_mask=mask, need_weights=False)[0])
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab=40, d=32, heads=4, layers=3, block_size=16, p=0.1, gradient_checkpointing=True):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(block_size, d)
        self.drop = nn.Dropout(p)
        self.blocks = nn.ModuleList(Block(d, heads, p) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.gradient_checkpointing = gradient_checkpointing

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.size(1))
        x = self.drop(self.tok(idx) + self.pos(pos))
        for block in self.blocks:
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def get_batch(data, gen, batch_size, block_size):
    ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=gen)
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    return x, y


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps")
    parser.add_argument("--grad-accum", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--eval-every", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    # a synthetic corpus with structure: a repeating pattern plus noise tokens
    pattern = torch.randint(0, 40, (23,), generator=gen)
    data = pattern.repeat(60)
    noise = torch.rand(len(data), generator=gen) < 0.1
    data[noise] = torch.randint(0, 40, (int(noise.sum()),), generator=gen)
    train_data, val_data = data[:1200], data[1200:]

    model = TinyLM(block_size=args.block_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    for step in range(args.steps):
        for micro_step in range(args.grad_accum):
            x, y = get_batch(train_data, gen, args.batch_size, args.block_size)
            _, loss = model(x, y)
            loss = loss / args.grad_accum
            loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"step {step + 1} loss {loss.item() * args.grad_accum:.4f} grad norm {norm.item():.3f}")

        if (step + 1) % args.eval_every == 0:
            model.eval()
            with torch.no_grad():
                x, y = get_batch(val_data, gen, 8, args.block_size)
                _, val_loss = model(x, y)
            print(f"  val loss {val_loss.item():.4f}")
            model.train()


if __name__ == "__main__":
    main()
