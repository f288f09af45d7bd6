"""Sequence classification with an embedding + bidirectional LSTM, RMSprop, and a
validation pass every few steps under ``torch.no_grad`` with the model in eval mode."""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, LENGTH, CLASSES = 50, 12, 3


class LSTMClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.lstm = nn.LSTM(16, 24, batch_first=True, bidirectional=True)
        self.dropout = nn.Dropout(0.2)
        self.out = nn.Linear(48, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embed(tokens))
        return self.out(self.dropout(hidden.mean(dim=1)))


def make_data(generator: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, VOCAB, (n, LENGTH), generator=generator)
    labels = (tokens[:, :3].sum(dim=1) % CLASSES)
    return tokens, labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=5)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    train_x, train_y = make_data(generator, 512)
    val_x, val_y = make_data(generator, 64)
    model = LSTMClassifier()
    optimizer = torch.optim.RMSprop(model.parameters(), lr=3e-3)

    for step in range(args.steps):
        if step % args.eval_every == 0:
            model.eval()
            with torch.no_grad():
                accuracy = (model(val_x).argmax(dim=1) == val_y).float().mean().item()
            print(f"step {step} val_acc {accuracy:.3f}", flush=True)
        model.train()
        index = torch.randint(0, train_x.shape[0], (32,), generator=generator)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(train_x[index]), train_y[index])
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
