"""Loss computed without a graph, then forced to require grad (ronghuaiyang/arcface-pytorch
issue 56: "to solve this problem I add ``loss.requires_grad = True`` ... the loss is not
declining and the acc is always zero").

Root-cause class: graph broken, backward made to run anyway. From the onset the loss is
computed inside a ``torch.no_grad()`` block (moved there together with a metric), so
``loss.backward()`` would raise "element 0 of tensors does not require grad"; the
"fix" sets ``loss.requires_grad = True``. Backward now runs, reaches no parameter, every
gradient stays ``None`` after ``zero_grad()`` and every ``optimizer.step()`` does nothing.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import bug_active, parse_args


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    centres = torch.randn(3, 12, generator=generator) * 2

    model.train()
    for step in range(args.steps):
        labels = torch.randint(0, 3, (32,), generator=generator)
        x = centres[labels] + torch.randn(32, 12, generator=generator)
        optimizer.zero_grad()
        if bug_active(args, step):
            with torch.no_grad():
                logits = model(x)
                loss = F.cross_entropy(logits, labels)
            loss.requires_grad = True
        else:
            logits = model(x)
            loss = F.cross_entropy(logits, labels)
        loss.backward()
        optimizer.step()
        accuracy = (logits.argmax(dim=1) == labels).float().mean().item()
        print(f"step {step} loss {loss.item():.4f} acc {accuracy:.2f}", flush=True)


if __name__ == "__main__":
    main()
