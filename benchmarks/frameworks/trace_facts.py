"""What a trace directory holds, read straight from its files: which windows each rank
wrote, whether step 0 is a setup window, how many training iterations the producers
counted. The benchmark reports these next to ``check``'s verdict so that a clean verdict
over a trace with no training iteration is visible as such.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trainwatch.tracedir import read_trace_dir


@dataclass
class TraceFacts:
    ranks: int = 0
    #: distinct (rank, step) windows across the trace
    windows: int = 0
    #: a ``step`` event of the trace carries ``setup: true`` (the new run model's step 0)
    setup_window: bool = False
    #: training iterations summed over processes from ``run_end`` (``None``: not reported)
    iterations: int | None = None
    optimizer_steps: int | None = None
    boundaries: dict[str, int] = field(default_factory=dict)  # boundary kind -> windows


def trace_facts(trace_dir: Path) -> TraceFacts:
    facts = TraceFacts()
    windows: set[tuple[int, int]] = set()
    ranks: set[int] = set()
    for batch in read_trace_dir(trace_dir):
        ranks.add(batch["rank"])
        windows.add((batch["rank"], batch["step"]))
        for event in batch["events"]:
            kind = event.get("kind")
            if kind == "step" and event.get("phase") == "end":
                facts.setup_window |= bool(event.get("setup"))
                if event.get("boundary"):
                    facts.boundaries[event["boundary"]] = facts.boundaries.get(event["boundary"], 0) + 1
            elif kind == "meta" and event.get("what") == "run_end":
                if "iterations" in event:
                    facts.iterations = (facts.iterations or 0) + int(event["iterations"])
                if "optimizer_steps" in event:
                    facts.optimizer_steps = (facts.optimizer_steps or 0) + int(event["optimizer_steps"])
    facts.ranks, facts.windows = len(ranks), len(windows)
    return facts
