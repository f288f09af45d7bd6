"""Activation checkpointing is training, not evaluation.

Reentrant checkpointing (Hugging Face's ``gradient_checkpointing=True`` by default) runs
each wrapped block without gradients first; dropout there is training dropout. The
shipped set's "dropout runs with training=False whenever gradients are disabled" must
not fire on it, and must still fire on a real evaluation pass that left dropout on.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.utils.checkpoint
from torch import nn

import producers
from producers.report import read_trace_dir

DROPOUT = "torch.nn.functional.dropout"


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(torch.relu(self.linear(x)))


class Checkpointed(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(8, 1)
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=self.reentrant)
        return self.head(x)


def test_reentrant_checkpointing_runs_its_block_without_gradients():
    """The torch behaviour the producer's checkpoint hook exists for."""
    assert "forward" in torch.utils.checkpoint.CheckpointFunction.__dict__
    seen = []

    def block(x):
        seen.append(torch.is_grad_enabled())
        return x * 2

    torch.utils.checkpoint.checkpoint(block, torch.ones(2, requires_grad=True), use_reentrant=True).sum().backward()
    assert seen == [False, True]  # first pass without gradients, recomputation with


def _train(trace_dir, reentrant: bool, evaluate_with_dropout_on: bool) -> None:
    with producers.instrument(run_id="r-ckpt", trace_dir=trace_dir, quiet=True):
        torch.manual_seed(0)
        model = Checkpointed(reentrant)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for _ in range(5):
            optimizer.zero_grad()
            model(torch.randn(4, 8, requires_grad=True)).pow(2).mean().backward()
            optimizer.step()
            if evaluate_with_dropout_on:  # model.eval() forgotten
                with torch.no_grad():
                    model(torch.randn(4, 8))


def _check(trace_dir) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainwatch.cli", "check", str(trace_dir)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpointed_training_is_clean_with_the_shipped_set(tmp_path, reentrant):
    _train(tmp_path, reentrant, evaluate_with_dropout_on=False)
    (batches,) = read_trace_dir(tmp_path).values()
    dropouts = [e for b in batches for e in b["events"] if e["kind"] == "call" and e["api"] == DROPOUT
                and e["phase"] == "pre"]
    assert dropouts and all(e["ctx"]["grad"] for e in dropouts)
    result = _check(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_evaluation_pass_with_dropout_on_is_still_reported(tmp_path):
    _train(tmp_path, reentrant=True, evaluate_with_dropout_on=True)
    result = _check(tmp_path)
    assert result.returncode == 1 and "whenever gradients are disabled" in result.stdout, result.stdout


class EmbeddedCheckpointed(Checkpointed):
    """Token embeddings before the checkpointed blocks (a language model's layout)."""

    def __init__(self) -> None:
        super().__init__(reentrant=True)
        self.embed = nn.Embedding(16, 8)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return super().forward(self.embed(tokens))


@pytest.mark.filterwarnings("ignore:None of the inputs have requires_grad")  # torch's own hint at the bug
def test_blocks_no_gradient_reaches_after_the_embeddings_froze_break_the_step_contract(tmp_path):
    """transformers#21381: with reentrant checkpointing, frozen embeddings leave every
    checkpointed block without a gradient path; only the head keeps training."""
    with producers.instrument(run_id="r-ckpt-cut", trace_dir=tmp_path, quiet=True):
        torch.manual_seed(0)
        model = EmbeddedCheckpointed()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for step in range(4):
            if step == 2:
                model.embed.requires_grad_(False)
            optimizer.zero_grad()
            model(torch.randint(0, 16, (4, 5))).pow(2).mean().backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():  # an evaluation through the same blocks is not training
            model(torch.randint(0, 16, (4, 5)))
    (batches,) = read_trace_dir(tmp_path).values()
    kept = [e["ctx"]["contract"]["grads_reach_what_ran"] for b in batches for e in b["events"]
            if e["kind"] == "call" and e["api"] == "torch.optim.Optimizer.step" and e["phase"] == "pre"]
    assert kept == [True, True, False, False]
