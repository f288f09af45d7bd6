"""Pure-bf16 training, as LLM fine-tuning scripts often do to halve memory: the model's
weights, activations and gradients are all bfloat16 (no autocast), gradients are clipped
by global norm every step, and the optimizer is a constant-rate AdamW with no schedule.

It keeps the default invariant set honest about dtypes: a rule such as "module outputs
are float32" is an artefact of fp32-only references."""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.nn import functional as F


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    model = nn.Sequential(
        nn.Linear(24, 48), nn.LayerNorm(48), nn.SiLU(), nn.Dropout(0.1), nn.Linear(48, 6)
    ).to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    prototypes = torch.randn(6, 24, generator=generator)

    model.train()
    for step in range(args.steps):
        labels = torch.randint(0, 6, (32,), generator=generator)
        inputs = (prototypes[labels] + torch.randn(32, 24, generator=generator)).to(torch.bfloat16)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(inputs).float(), labels)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        if step % 5 == 0:
            print(f"step {step} loss {loss.item():.4f} grad_norm {grad_norm.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
