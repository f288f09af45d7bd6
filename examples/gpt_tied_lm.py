"""A tiny GPT-style causal language model: tied input/output embeddings, AdamW with a
decoupled weight-decay split, gradient-norm clipping and a linear warmup schedule.

Weight tying is why this pipeline is in the reference set: the embedding and the LM head
are one tensor, so any code that unties them (a resize, a checkpoint load) is visible.
"""

from __future__ import annotations

import argparse
import math

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, CONTEXT, WIDTH, HEADS = 64, 16, 32, 4


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(WIDTH)
        self.attn = nn.MultiheadAttention(WIDTH, HEADS, dropout=0.1, batch_first=True)
        self.ln2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH), nn.Dropout(0.1))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Parameter(torch.zeros(CONTEXT, WIDTH))
        self.blocks = nn.ModuleList([Block(), Block()])
        self.ln_f = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.tok.weight  # weight tying
        nn.init.normal_(self.tok.weight, std=0.02)  # GPT-2 initialisation; keeps tied logits small

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        length = idx.shape[1]
        mask = torch.triu(torch.full((length, length), float("-inf")), diagonal=1)
        x = self.tok(idx) + self.pos[:length]
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln_f(x))


class GreedySampler(nn.Module):
    """Greedy continuation for monitoring samples; returns only the new token ids."""

    def __init__(self, lm: TinyGPT) -> None:
        super().__init__()
        self.lm = lm

    @torch.no_grad()
    def forward(self, prompt: torch.Tensor, max_new_tokens: int = 8) -> torch.Tensor:
        sequence = prompt
        for _ in range(max_new_tokens):
            context = sequence[:, -CONTEXT:]
            sequence = torch.cat([sequence, self.lm(context)[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
        return sequence[:, prompt.shape[1]:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    # A learnable toy language: each token is (previous + 3) mod VOCAB, with noise.
    start = torch.randint(0, VOCAB, (512, 1), generator=generator)
    corpus = (start + 3 * torch.arange(CONTEXT + 1)) % VOCAB

    model = TinyGPT()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=3e-3
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / args.warmup) * 0.5 * (1 + math.cos(math.pi * s / max(1, args.steps)))
    )

    sampler = GreedySampler(model)
    model.train()
    for step in range(args.steps):
        if step % 3 == 2:  # look at a sample now and then
            sampler.eval()
            sample = sampler(corpus[:2, :4], max_new_tokens=6)
            sampler.train()
            print(f"step {step} sample {sample[0].tolist()}", flush=True)
        batch = corpus[torch.randint(0, corpus.shape[0], (16,), generator=generator)]
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 5 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
