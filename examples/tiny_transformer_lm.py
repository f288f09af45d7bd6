"""A tiny causal transformer language model with AdamW, warmup schedule and clipping.

The sequences follow a simple deterministic rule (next token = previous + 1 modulo the
vocabulary, with a random start), so the loss drops quickly and a healthy run is easy
to tell from a broken one.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, layers: int, context: int) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(vocab, dim)
        self.position_embedding = nn.Embedding(context, dim)
        layer = nn.TransformerEncoderLayer(
            d_model=dim, nhead=heads, dim_feedforward=dim * 2, dropout=0.1, batch_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.register_buffer(
            "causal_mask", nn.Transformer.generate_square_subsequent_mask(context), persistent=False
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        positions = torch.arange(length, device=tokens.device)
        hidden = self.token_embedding(tokens) + self.position_embedding(positions)
        hidden = self.blocks(hidden, mask=self.causal_mask[:length, :length], is_causal=True)
        return self.lm_head(self.norm(hidden))


def make_batch(batch_size: int, length: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.randint(0, vocab, (batch_size, 1))
    sequence = (starts + torch.arange(length + 1)) % vocab
    return sequence[:, :-1], sequence[:, 1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--context", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=32)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    model = TinyLM(args.vocab, args.dim, heads=2, layers=2, context=args.context)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warmup = max(args.steps // 10, 1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    loss_fn = nn.CrossEntropyLoss()

    model.train()
    loss = torch.tensor(float("nan"))
    for _ in range(args.steps):
        tokens, targets = make_batch(args.batch_size, args.context, args.vocab)
        optimizer.zero_grad(set_to_none=True)
        logits = model(tokens)
        loss = loss_fn(logits.reshape(-1, args.vocab), targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        scheduler.step()
    print(f"tiny_transformer_lm: {args.steps} steps, final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
