"""Tied input/output embeddings silently untied (the Transformers family of reports where
``resize_token_embeddings`` or a checkpoint load replaced one side of a tied pair).

The LM ties ``head.weight`` to ``embed.weight``. At the onset training restarts from a
checkpoint. The healthy twin restores it in place (``load_state_dict``); the buggy
restore helper assigns fresh ``Parameter`` objects (``assign=True``), one per state-dict
key — and a state dict holds a tied tensor under both names, so the pair comes back as
two independent matrices that receive different updates and drift apart while the loss
keeps falling.
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

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.mix(self.embed(tokens)))


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    model = TiedLM()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    checkpoint = {name: value.clone() for name, value in model.state_dict().items()}

    model.train()
    for step in range(args.steps):
        if step == args.onset:
            model.load_state_dict(checkpoint, assign=bug_active(args, step))
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
