"""What the checker stores per (run, step) in its Faust table, around the engine's state.

The engine owns the *facts* of a window (`WindowState`); the checker owns its life
cycle: when it opened, when it last heard from a rank, which batches it has already
folded (Kafka delivers at least once, so after a restart a batch can come twice;
a batch is identified by rank, producing pid and that process's seq),
the per-step signal summary, and — once closed — the ids of the violations it emitted.
Keeping the closed marker for a while (instead of deleting the key at close) is what
lets the worker tell a *late* batch from a *replayed* one and never emit a violation
twice.  The record is a msgpack map; the engine's state is nested as opaque bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from invariants.step_summary import StepSummaryBuilder

FORMAT = 1


def window_key(run: str, step: int) -> bytes:
    """Table key of a window; equal to the events topic's message key (`batch_key`)."""
    return f"{run}:{step}".encode()


@dataclass
class WindowRecord:
    run: str
    step: int
    partition: int
    opened_at: float
    last_batch_at: float
    engine_state: bytes | None = None  # None once closed
    summary: dict[str, Any] | None = None  # StepSummaryBuilder state while open
    seen: list[list[int]] = field(default_factory=list)  # [rank, pid, seq] folded so far
    closed_at: float | None = None
    emitted: list[str] = field(default_factory=list)  # violation ids emitted at close
    newest_producer_ts: float = 0.0
    lifecycle: list[list[Any]] = field(default_factory=list)  # [rank, "run_start"|"run_end"]
    #: the live summary reducer while the record is in memory; `summary` is its state as
    #: last written, refreshed by `to_bytes` (not serialised itself)
    builder: Any = field(default=None, compare=False, repr=False)

    def summary_builder(self) -> StepSummaryBuilder:
        """The step summary reducer, rebuilt from the stored state once per record load."""
        if self.builder is None:
            self.builder = StepSummaryBuilder.from_dict(self.summary or {"run": self.run, "step": self.step})
        return self.builder

    @property
    def closed(self) -> bool:
        return self.closed_at is not None

    def has_seen(self, rank: int, pid: int, seq: int) -> bool:
        # seq counts per producing process: a rank's DataLoader workers start at 0 too
        return [rank, pid, seq] in self.seen

    def to_bytes(self) -> bytes:
        if self.builder is not None:
            self.summary = self.builder.to_dict()
        return msgpack.packb(
            [
                FORMAT, self.run, self.step, self.partition, self.opened_at, self.last_batch_at,
                self.engine_state, self.summary, self.seen, self.closed_at, self.emitted,
                self.newest_producer_ts, self.lifecycle,
            ],
            use_bin_type=True,
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> "WindowRecord":
        fields = msgpack.unpackb(data, raw=False, strict_map_key=False)
        if not isinstance(fields, list) or not fields or fields[0] != FORMAT:
            raise ValueError("unknown window record format")
        (_, run, step, partition, opened_at, last_batch_at, engine_state, summary, seen,
         closed_at, emitted, newest_producer_ts, lifecycle) = fields
        return cls(run, step, partition, opened_at, last_batch_at, engine_state, summary,
                   [list(pair) for pair in seen], closed_at, list(emitted), newest_producer_ts,
                   [list(item) for item in lifecycle])
