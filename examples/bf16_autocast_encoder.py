"""A transformer-encoder sequence classifier trained under CPU bf16 autocast with AdamW
and a one-cycle learning-rate schedule; validation also runs under autocast.

Second autocast reference next to ``bf16_autocast.py``: with attention, LayerNorm and
embeddings in the mix, what autocast keeps in fp32 and what it casts to bf16 is learned
from more than one model."""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, LENGTH, WIDTH = 40, 10, 32


class EncoderClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, 4, dim_feedforward=64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=1)
        self.head = nn.Linear(WIDTH, 2)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


def batch(generator: torch.Generator, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, VOCAB, (size, LENGTH), generator=generator)
    return tokens, (tokens < VOCAB // 2).sum(dim=1).gt(LENGTH // 2).long()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    model = EncoderClassifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=max(2, args.steps))
    val_tokens, val_labels = batch(generator, 32)

    for step in range(args.steps):
        model.train()
        tokens, labels = batch(generator, 16)
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(tokens)
        loss = F.cross_entropy(logits.float(), labels)
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % 3 == 2:
            model.eval()
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                accuracy = (model(val_tokens).argmax(dim=1) == val_labels).float().mean().item()
            print(f"step {step} loss {loss.item():.4f} val_acc {accuracy:.3f}", flush=True)


if __name__ == "__main__":
    main()
