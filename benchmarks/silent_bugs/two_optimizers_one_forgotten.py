"""An encoder and a decoder with one optimizer each, as in the PyTorch seq2seq tutorial
(``encoder_optimizer`` / ``decoder_optimizer``, both cleared and stepped every iteration).

From the onset a refactor leaves only ``encoder_optimizer.zero_grad()`` in the loop: the
decoder's gradients accumulate across iterations while the encoder's are cleared, so a
"zero_grad before step" that any optimizer satisfies says nothing about the decoder's.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import bug_active, parse_args

VOCAB, HIDDEN = 20, 24


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.rnn = nn.GRU(HIDDEN, HIDDEN, batch_first=True)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.rnn(self.embed(tokens))[1]


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.rnn = nn.GRU(HIDDEN, HIDDEN, batch_first=True)
        self.out = nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return self.out(self.rnn(self.embed(tokens), hidden)[0])


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    encoder, decoder = Encoder(), Decoder()
    encoder_optimizer = torch.optim.SGD(encoder.parameters(), lr=0.1)
    decoder_optimizer = torch.optim.SGD(decoder.parameters(), lr=0.1)

    encoder.train()
    decoder.train()
    for step in range(args.steps):
        source = torch.randint(1, VOCAB, (16, 6), generator=generator)
        target = source.flip(1)  # learn to reverse the sequence
        encoder_optimizer.zero_grad()
        if not bug_active(args, step):
            decoder_optimizer.zero_grad()
        decoder_input = torch.cat([torch.zeros(16, 1, dtype=torch.long), target[:, :-1]], dim=1)
        logits = decoder(decoder_input, encoder(source))
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))
        loss.backward()
        encoder_optimizer.step()
        decoder_optimizer.step()
        print(f"step {step} loss {loss.item():.4f} dec_grad {decoder.out.weight.grad.norm().item():.3f}", flush=True)


if __name__ == "__main__":
    main()
