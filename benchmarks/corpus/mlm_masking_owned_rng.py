"""Masked-language-model pre-training whose dataset draws its masks from an owned RNG.

Modelled on: BERT's pre-training data pipeline (google-research/bert
create_pretraining_data.py: a ``random.Random(seed)`` object decides which tokens are
masked, replaced or kept, 80/10/10) served through a multi-worker PyTorch DataLoader,
with the HuggingFace-style AdamW + linear warm-up schedule.  Habits reproduced: the
dataset keeps its own ``random.Random``; ``worker_init_fn`` gives each worker its own
stream from the worker's seed (``get_worker_info().seed``); the loss ignores unmasked
positions with ``ignore_index=-100``; gradient clipping; ``model.zero_grad()`` after the
step.
"""

from __future__ import annotations

import argparse
import random

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, get_worker_info

VOCAB, LENGTH, MASK_ID, SPECIAL = 48, 16, 1, 2


class MaskedTokens(Dataset):
    def __init__(self, length: int, seed: int) -> None:
        corpus = torch.Generator().manual_seed(seed)
        base = torch.randint(SPECIAL, VOCAB, (length, LENGTH // 2), generator=corpus)
        self.sequences = torch.cat([base, base.flip(1)], dim=1)  # a learnable structure
        self.rng = random.Random(seed)

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self.sequences[index].clone()
        labels = torch.full_like(tokens, -100)
        for position in range(LENGTH):
            if self.rng.random() >= 0.15:
                continue
            labels[position] = tokens[position]
            roll = self.rng.random()
            if roll < 0.8:
                tokens[position] = MASK_ID
            elif roll < 0.9:
                tokens[position] = self.rng.randrange(SPECIAL, VOCAB)
        return tokens, labels


def worker_rng(worker_id: int) -> None:
    info = get_worker_info()
    info.dataset.rng = random.Random(info.seed)


class TinyEncoder(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.position = nn.Parameter(torch.zeros(LENGTH, width))
        layer = nn.TransformerEncoderLayer(width, 4, 64, dropout=0.1, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.encoder(self.embed(tokens) + self.position)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--epoch-batches", type=int, default=3, help="batches per (short) epoch")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    loader = DataLoader(MaskedTokens(8 * args.epoch_batches, args.seed), batch_size=8, shuffle=True,
                        num_workers=args.workers, worker_init_fn=worker_rng,
                        generator=torch.Generator().manual_seed(args.seed))
    model = TinyEncoder()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "position" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2 or "position" in n]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=2e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda it: min((it + 1) / args.warmup, max(0.0, (args.steps - it) / (args.steps - args.warmup))))

    model.train()
    step = 0
    for epoch in range(args.steps):  # short epochs: workers start afresh each one
        for tokens, labels in loader:
            logits = model(tokens)
            loss = F.cross_entropy(logits.view(-1, VOCAB), labels.view(-1), ignore_index=-100)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            model.zero_grad()
            if step % 5 == 0:
                print(f"epoch {epoch} step {step} mlm loss {loss.item():.4f} lr {scheduler.get_last_lr()[0]:.2e}",
                      flush=True)
            step += 1
            if step >= args.steps:
                return


if __name__ == "__main__":
    main()
