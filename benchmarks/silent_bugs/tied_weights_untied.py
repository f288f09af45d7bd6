"""Tied input/output embeddings silently untied (the Transformers family of reports where
``resize_token_embeddings`` or a checkpoint load replaced one side of a tied pair).

The LM ties ``head.weight`` to ``embed.weight``. At the onset the vocabulary is resized
by building a new embedding; the healthy twin re-ties the head to it, the buggy run
copies the weights into a fresh head instead, so from then on the two matrices receive
different updates and drift apart while the loss keeps falling.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import bug_active, parse_args

VOCAB, WIDTH = 20, 16


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.mix = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh())
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def resize_token_embeddings(self, size: int, retie: bool) -> None:
        old = self.embed.weight.data
        self.embed = nn.Embedding(size, WIDTH)
        with torch.no_grad():
            self.embed.weight[: old.shape[0]] = old[:size]
        if retie:
            self.head = nn.Linear(WIDTH, size, bias=False)
            self.head.weight = self.embed.weight
        else:
            self.head = nn.Linear(WIDTH, size, bias=False)
            with torch.no_grad():
                self.head.weight.copy_(self.embed.weight)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.mix(self.embed(tokens)))


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    model = TiedLM()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

    model.train()
    for step in range(args.steps):
        if step == args.onset:
            model.resize_token_embeddings(VOCAB, retie=not bug_active(args, step))
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        tokens = torch.randint(0, VOCAB, (16, 6), generator=generator)
        optimizer.zero_grad()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), ((tokens[:, :-1] * 3) % VOCAB).reshape(-1))
        loss.backward()
        optimizer.step()
        gap = (model.head.weight - model.embed.weight).abs().max().item()
        print(f"step {step} loss {loss.item():.4f} tie_gap {gap:.2e}", flush=True)


if __name__ == "__main__":
    main()
