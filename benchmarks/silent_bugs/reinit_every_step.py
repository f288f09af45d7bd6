"""Weights re-initialised repeatedly (Transformers issue 17877: GPT-2 ``_init_weights``
re-ran on already-initialised modules).

The model's ``post_init()`` applies ``nn.init.normal_`` to every Linear/Embedding. From
the onset a helper that "refreshes" the model before each step (here: re-applying
``post_init`` when switching a config flag) re-initialises all weights every step, so
training progress is erased each time while the loss stays plausible.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import bug_active, parse_args

VOCAB, WIDTH = 32, 16


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH))
        self.lm_head = nn.Linear(WIDTH, VOCAB)
        self.post_init()

    def post_init(self) -> None:
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.wte(tokens)
        return self.lm_head(h + self.mlp(h))


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    model.train()
    for step in range(args.steps):
        if bug_active(args, step):
            model.post_init()  # the "refresh" that should have been a no-op
        tokens = torch.randint(0, VOCAB, (16, 8), generator=generator)
        optimizer.zero_grad()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), ((tokens[:, :-1] + 1) % VOCAB).reshape(-1))
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
