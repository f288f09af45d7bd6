"""Activation checkpointing with ``preserve_rng_state=False`` recomputes a block with
dropout under other masks, so its gradients belong to another network than the loss
(allenai/OLMo-core PR 828).  ``replays_checkpoint_rng`` breaks at the first step after
such a block drew random numbers; the default ``preserve_rng_state=True``, blocks that
draw nothing and evaluation passes keep it or are not judged."""

from __future__ import annotations

import torch
import torch.utils.checkpoint
from torch import nn

import producers
from invariants.events import OPTIMIZER_STEP
from tests.support.producer_traces import trace_batches, trace_events

CONTRACT = "replays_checkpoint_rng"


class Blocks(nn.Module):
    def __init__(self, dropout: float, preserve: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.Dropout(dropout)) for _ in range(2))
        self.head = nn.Linear(8, 1)
        self.preserve = preserve

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False, preserve_rng_state=self.preserve)
        return self.head(x)


def _verdicts(tmp_path) -> list:
    return [((event.get("ctx") or {}).get("contract") or {}).get(CONTRACT)
            for _, event in trace_events(trace_batches(tmp_path))
            if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == OPTIMIZER_STEP]


def _train(model: nn.Module, steps: int, *, late_dropout: float | None = None) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        if late_dropout is not None and step == 2:
            for block in model.blocks:
                block[1].p = late_dropout
        optimizer.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()
        optimizer.step()
        model.eval()
        with torch.no_grad():
            model(torch.randn(4, 8))
        model.train()


def test_late_dropout_in_blocks_recomputed_without_their_rng_breaks_it(tmp_path):
    with producers.instrument(run_id="r-ckpt-rng", trace_dir=tmp_path, quiet=True):
        _train(Blocks(0.0, preserve=False), 4, late_dropout=0.1)
    # no randomness before the dropout is switched on: not judged
    assert _verdicts(tmp_path) == [None, None, False, False]


def test_preserved_rng_state_keeps_it(tmp_path):
    with producers.instrument(run_id="r-ckpt-rng-ok", trace_dir=tmp_path, quiet=True):
        _train(Blocks(0.1, preserve=True), 3)
    assert _verdicts(tmp_path) == [True] * 3
