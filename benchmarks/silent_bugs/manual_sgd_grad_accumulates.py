"""A hand-written SGD loop that stops clearing gradients (the pattern of pytorch/examples'
word-language-model loop, which updates with ``p.data.add_(p.grad, alpha=-lr)`` and no
``torch.optim``; the bug is the one asked about again and again: "why does my loss blow
up when I remove ``model.zero_grad()``").

The loop clears gradients with ``model.zero_grad()`` and applies the update by hand. From
the onset the clearing call sits behind a logging condition that is never true any more,
so every update uses the sum of all gradients since the onset. No optimizer object exists:
the training iterations are visible only as forward / backward / in-place updates.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import bug_active, parse_args

LR = 0.05


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(12, 24), nn.Tanh(), nn.Linear(24, 3))
    target = torch.randn(12, 3, generator=generator)

    model.train()
    for step in range(args.steps):
        x = torch.randn(32, 12, generator=generator)
        if not bug_active(args, step):
            model.zero_grad()
        loss = F.mse_loss(model(x), x @ target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-LR)
        print(f"step {step} loss {loss.item():.4f} grad_norm {model[0].weight.grad.norm().item():.3f}", flush=True)


if __name__ == "__main__":
    main()
