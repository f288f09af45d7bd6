"""Pre-train, checkpoint, then fine-tune a new classifier from the checkpointed encoder.

The encoder initialises itself the way many model libraries do, writing ``.data`` in
place (``weight.data.normal_(0, 0.02)``, ``bias.data.zero_()``, LayerNorm
``weight.data.fill_(1.0)``).  A short pre-training saves the encoder's state dict; the
fine-tuning job then builds a fresh classifier (encoder + new head, both initialised),
loads the encoder with ``load_state_dict`` and trains everything.  An exponential
moving average of the classifier, synchronised with ``load_state_dict`` and then
updated with ``copy_`` (as target networks are), is what validation evaluates.

Every initialiser here writes parameters that hold no learned values yet: the loaded
encoder is never initialised again, and the head is new."""

from __future__ import annotations

import argparse
import io

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, WIDTH, CLASSES = 32, 16, 4


def init_weights(module: nn.Module) -> None:
    """Library-style initialisation, applied with ``Module.apply``."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        module.weight.data.normal_(mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        module.bias.data.zero_()
    if isinstance(module, nn.LayerNorm):
        module.weight.data.fill_(1.0)
        module.bias.data.zero_()


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.mix = nn.Linear(WIDTH, 2 * WIDTH)
        self.out = nn.Linear(2 * WIDTH, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.apply(init_weights)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(tokens)
        return self.norm(hidden + self.out(torch.tanh(self.mix(hidden)))).mean(1)


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.head = nn.Linear(WIDTH, CLASSES)
        self.head.apply(init_weights)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(tokens))


def batch(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, VOCAB, (16, 6), generator=generator)
    return tokens, tokens[:, 0] % CLASSES


def pretrain(steps: int, generator: torch.Generator) -> io.BytesIO:
    """Train the encoder on a token-prediction task; return its checkpoint."""
    encoder, lm_head = Encoder(), nn.Linear(WIDTH, VOCAB)
    optimizer = torch.optim.AdamW([*encoder.parameters(), *lm_head.parameters()], lr=1e-2)
    for _ in range(steps):
        tokens, _ = batch(generator)
        optimizer.zero_grad()
        F.cross_entropy(lm_head(encoder(tokens)), tokens[:, -1]).backward()
        optimizer.step()
    buffer = io.BytesIO()
    torch.save(encoder.state_dict(), buffer)
    buffer.seek(0)
    return buffer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--pretrain-steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--val-every", type=int, default=5)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    checkpoint = pretrain(args.pretrain_steps, generator)

    model = Classifier()
    model.encoder.load_state_dict(torch.load(checkpoint))
    average = Classifier().requires_grad_(False)
    average.load_state_dict(model.state_dict())
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    for step in range(args.steps):
        model.train()
        tokens, labels = batch(generator)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(tokens), labels)
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            for kept, live in zip(average.parameters(), model.parameters()):
                kept.data.copy_(0.9 * kept + 0.1 * live)
        if step % args.val_every == 0:
            average.eval()
            with torch.no_grad():
                tokens, labels = batch(generator)
                accuracy = (average(tokens).argmax(1) == labels).float().mean().item()
            print(f"step {step} loss {loss.item():.4f} val_acc {accuracy:.2f}", flush=True)


if __name__ == "__main__":
    main()
