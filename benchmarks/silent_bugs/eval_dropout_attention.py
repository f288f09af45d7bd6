"""Dropout left active in evaluation by an attention kernel (Transformers issue 33844:
the M2M100 FlashAttention-2 path passed a fixed dropout probability and ignored
``self.training``).

Each step starts with a validation pass in ``eval()`` mode. From the onset the model
switches to a "fast" attention path that calls ``F.dropout(..., training=True)``
unconditionally, so validation scores become noisy and non-deterministic while training
itself is unchanged.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import bug_active, parse_args

WIDTH, LENGTH = 16, 6


class SelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.attention_dropout = 0.2
        self.fast_path = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        weights = torch.softmax(q @ k.transpose(1, 2) / WIDTH**0.5, dim=-1)
        # The fast kernel hard-codes training=True; the reference path respects the mode.
        training = True if self.fast_path else self.training
        weights = F.dropout(weights, p=self.attention_dropout, training=training)
        return self.proj(weights @ v)


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, WIDTH)
        self.attention = SelfAttention()
        self.head = nn.Linear(WIDTH, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        return self.head((h + self.attention(h)).mean(dim=1))


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    model = Classifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    val_x = torch.randn(32, LENGTH, 4, generator=generator)
    val_y = (val_x[:, :, 0].sum(dim=1) > 0).long()

    for step in range(args.steps):
        model.attention.fast_path = bug_active(args, step)
        model.eval()
        with torch.no_grad():
            first, second = model(val_x), model(val_x)
        model.train()
        x = torch.randn(32, LENGTH, 4, generator=generator)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), (x[:, :, 0].sum(dim=1) > 0).long())
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f} eval_nondeterminism {(first - second).abs().max().item():.2e} "
              f"val_acc {(first.argmax(1) == val_y).float().mean().item():.2f}", flush=True)


if __name__ == "__main__":
    main()
