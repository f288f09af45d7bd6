"""Shared by the framework programs: offline settings, the command line, tiny configs and
synthetic data, so that each program is only its framework's way of training.

Every program is healthy without ``--bug`` and plants its silent error from training
iteration ``--onset`` (counted from 0, as the silent-bug benchmark counts) with it. No
program touches the network: models are built from config objects and the Hugging Face
libraries are put in offline mode before they are imported.
"""

from __future__ import annotations

import argparse
import os

for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_name, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import torch  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402

VOCAB, SEQ = 64, 12


def parse_args(description: str | None, bugs: tuple[str, ...], default_steps: int = 12,
               default_onset: int = 6, flags: tuple[tuple[str, str], ...] = ()) -> argparse.Namespace:
    """The shared command line; ``flags`` are (name, help) pairs of program-specific switches."""
    parser = argparse.ArgumentParser(description=description)
    for name, help_text in flags:
        parser.add_argument(name, action="store_true", help=help_text)
    parser.add_argument("--bug", choices=bugs, default=None, help="plant this silent error (default: healthy)")
    parser.add_argument("--onset", type=int, default=default_onset, help="first training iteration with the bug")
    parser.add_argument("--steps", type=int, default=default_steps, help="optimizer steps to run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    parser.add_argument("--devices", type=int, default=1, help="processes (frameworks that launch their own)")
    parser.add_argument("--output-dir", default=None, help="scratch directory (default: a temporary one)")
    return parser.parse_args()


class TokenParity(Dataset):
    """Sequences of random tokens labelled by the parity of their first token: learnable
    within a few dozen steps by a two-layer encoder, deterministic per seed."""

    def __init__(self, size: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(1, VOCAB, (size, SEQ), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        tokens = self.tokens[index]
        return {"input_ids": tokens, "attention_mask": torch.ones_like(tokens), "labels": tokens[0] % 2}


class NextToken(Dataset):
    """Causal-LM samples: a token sequence that counts up modulo the vocabulary from a
    random start, so the next token is predictable."""

    def __init__(self, size: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, VOCAB, (size, 1), generator=generator)
        self.tokens = (starts + torch.arange(SEQ)) % VOCAB

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        tokens = self.tokens[index]
        return {"input_ids": tokens, "labels": tokens}


def tiny_bert_config(num_labels: int = 2):
    from transformers import BertConfig

    return BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=SEQ, num_labels=num_labels)


def tiny_gpt2_config():
    from transformers import GPT2Config

    return GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
