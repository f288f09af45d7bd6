"""Generation ignoring ``max_new_tokens`` (Transformers issue 23723: Whisper with
``prompt_ids`` generated past the requested limit).

A small LM is trained; at the start of each step a sampler module generates a short
continuation for monitoring. From the onset the sampler is given a prompt, and the buggy
stopping rule counts the prompt against the wrong budget — it stops after
``max_new_tokens + len(prompt)`` new tokens instead of ``max_new_tokens``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from _common import bug_active, parse_args

VOCAB = 24


class LM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.rnn = nn.GRU(16, 32, batch_first=True)
        self.head = nn.Linear(32, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.rnn(self.embed(tokens))
        return self.head(hidden)


class GreedySampler(nn.Module):
    """Returns only the newly generated tokens, at most ``max_new_tokens`` of them."""

    def __init__(self, lm: LM) -> None:
        super().__init__()
        self.lm = lm
        self.prompt_budget_bug = False

    @torch.no_grad()
    def forward(self, prompt: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        limit = max_new_tokens + (prompt.shape[1] if self.prompt_budget_bug else 0)
        sequence = prompt
        for _ in range(limit):
            next_token = self.lm(sequence)[:, -1].argmax(dim=-1, keepdim=True)
            sequence = torch.cat([sequence, next_token], dim=1)
        return sequence[:, prompt.shape[1]:]


def main() -> None:
    args = parse_args(__doc__)
    generator = torch.Generator().manual_seed(args.seed)
    lm = LM()
    sampler = GreedySampler(lm)
    optimizer = torch.optim.Adam(lm.parameters(), lr=5e-3)

    for step in range(args.steps):
        sampler.eval()
        sampler.prompt_budget_bug = bug_active(args, step)
        prompt_length = 4 if step >= args.onset else 1
        prompt = torch.randint(0, VOCAB, (2, prompt_length), generator=generator)
        sample = sampler(prompt, max_new_tokens=6)
        sampler.train()
        start = torch.randint(0, VOCAB, (16, 1), generator=generator)
        tokens = (start + 5 * torch.arange(10)) % VOCAB
        optimizer.zero_grad()
        loss = F.cross_entropy(lm(tokens[:, :-1]).reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f} generated {sample.shape[1]}", flush=True)


if __name__ == "__main__":
    main()
