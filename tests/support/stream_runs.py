"""Synthetic runs for the streaming checker tests, and what the checker should say about them.

The expected violations come from the offline engine (`StepWindows`) over the same
batches, so the checking and the recovery tests both compare a live worker against
one code path.
"""

from __future__ import annotations

import math

from invariants.engine import Engine
from invariants.invariant_file import load_set
from invariants.step_windows import StepWindows
from tests.support.kafka import iter_violations, read_topic, synthetic_step_batch

EVENTS = "trainwatch.events"
VIOLATIONS = "trainwatch.violations"
DEAD_LETTER = "trainwatch.dead-letter"
FAST = ["--grace-seconds", "1", "--partitions", "4"]


def run_batches(run: str, steps: range, *, diverge_from: int | None = None, missing_rank1: set[int] = frozenset(),
                nan_loss_at: int | None = None) -> list[dict]:
    batches = []
    for step in steps:
        for rank in (0, 1):
            if rank == 1 and step in missing_rank1:
                continue
            bad = diverge_from is not None and rank == 1 and step >= diverge_from
            loss = math.nan if step == nan_loss_at else None
            batches.append(synthetic_step_batch(run, rank, 2, step, digest="x3:bad" if bad else None, loss=loss))
    return batches


def expected_ids(batches: list[dict], invariants: str) -> set[str]:
    with open(invariants, "rb") as handle:
        windows = StepWindows(Engine(load_set(handle.read(), invariants)))
    found = []
    for batch in batches:
        found += windows.feed(batch)
    found += windows.finish()
    return {v.id for v in found}


def invariant_violations(bootstrap: str) -> list[dict]:
    return [v for v in iter_violations(read_topic(bootstrap, VIOLATIONS)) if not v["relation"].startswith("Trend:")]
