"""An evaluation job that re-initialises the weights it has just loaded (Transformers
reports of "my fine-tuned model predicts at chance after loading": the model's own
``_init_weights``, written the way many model libraries write it —
``module.weight.data.normal_(mean=0.0, std=0.02)`` — runs again after the state dict was
loaded).

The job builds the model, loads a checkpoint (written here from a short in-memory
pre-training so the program needs no files), and evaluates. With ``--bug`` an
``init_weights()`` call that belongs before the load is made after it, overwriting every
loaded Linear/Embedding in place. No training step follows: the whole run is its setup
window (``--onset`` is ignored; the bug is live from the setup window on).
"""

from __future__ import annotations

import io

import torch
from torch import nn
from torch.nn import functional as F

from _common import parse_args

VOCAB, WIDTH = 24, 16


class TinyTagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.classifier = nn.Linear(WIDTH, 4)

    def init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.data.normal_(mean=0.0, std=0.02)
            if isinstance(module, nn.Linear):
                module.bias.data.zero_()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.tanh(self.proj(self.embed(tokens))).mean(1))


def checkpoint_bytes(seed: int) -> io.BytesIO:
    """A 'fine-tuned' checkpoint: weights drawn once from their own generator, so the
    evaluation job itself runs no training step."""
    generator = torch.Generator().manual_seed(seed + 100)
    donor = TinyTagger()
    with torch.no_grad():
        for p in donor.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
    buffer = io.BytesIO()
    torch.save(donor.state_dict(), buffer)
    buffer.seek(0)
    return buffer


def main() -> None:
    args = parse_args(__doc__)
    buffer = checkpoint_bytes(args.seed)
    model = TinyTagger()
    if not args.bug:
        model.init_weights()
    model.load_state_dict(torch.load(buffer))
    if args.bug:
        model.init_weights()  # the bug: runs after the load and erases it
    model.eval()

    generator = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        for batch in range(args.steps):
            tokens = torch.randint(0, VOCAB, (16, 5), generator=generator)
            logits = model(tokens)
            loss = F.cross_entropy(logits, tokens[:, 0] % 4)
            print(f"batch {batch} loss {loss.item():.4f} logit_std {logits.std().item():.4f}", flush=True)


if __name__ == "__main__":
    main()
