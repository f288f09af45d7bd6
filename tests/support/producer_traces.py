"""Reading back what an in-process producer session wrote, and the tiny training loop the
producer tests record.

The producer tests assert on decoded trace files rather than on the tracer's internals,
so they check the same bytes a checker would read.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import torch
from torch import nn

from producers.report import read_trace_dir


def trace_batches(trace_dir: Path) -> list[dict]:
    files = read_trace_dir(trace_dir)
    assert len(files) == 1, files.keys()
    return next(iter(files.values()))


def trace_events(batches):
    for batch in batches:
        for event in batch["events"]:
            yield batch["step"], event


def trace_states(batches, at):
    """step -> name -> attrs of snapshots taken at ``at``."""
    found: dict[int, dict[str, dict]] = defaultdict(dict)
    for step, event in trace_events(batches):
        if event["kind"] == "state" and event["at"] == at:
            found[step][event["name"]] = event["attrs"]
    return found


def train_steps(model: nn.Module, steps: int, optimizer=None, lr: float = 0.1) -> None:
    optimizer = optimizer or torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(4, 3)).pow(2).mean().backward()
        optimizer.step()
