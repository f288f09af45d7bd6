"""Which steps take parameter snapshots: every N-th, or as many as an overhead budget allows.

Snapshots (digests and norms of every parameter around the optimizer step) are the
part of the producer's cost that grows with the model, and the only part that can be
thinned without losing events: a step without them still has every call, mode and
order checked.  With ``--overhead-budget B`` the producer measures its own time per
step — inside its hooks, and in snapshots — against the step's wall time, and picks
the snapshot period that keeps the two together at or below ``B``.

Periods are powers of two and a step snapshots when ``step % period == 0``, so ranks
that settle on different periods still snapshot together on the steps the larger
period picks: cross-rank comparisons keep their evidence.  Nothing is silent: every
step end without snapshots says so (``unsampled``), and ``producer_stats`` carries
the period and the measured shares, which the collect summary and every verdict's
coverage line repeat.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

#: the longest snapshot period a budget may choose (a snapshot at least every ~17 min of 1 s steps)
MAX_PERIOD = 1024
#: the period is reconsidered after this many steps, or this much wall time, whichever comes first
ADAPT_STEPS = 8
ADAPT_NS = 2_000_000_000


@dataclass
class OverheadTotals:
    """Nanoseconds since the run started, as ``producer_stats`` reports them."""

    wall_ns: int = 0
    hooks_ns: int = 0  # inside the producer's hooks, snapshots taken there included
    snapshot_ns: int = 0
    steps: int = 0
    snapshotted_steps: int = 0

    def share(self) -> float:
        return self.hooks_ns / self.wall_ns if self.wall_ns else 0.0

    def snapshot_share(self) -> float:
        return self.snapshot_ns / self.wall_ns if self.wall_ns else 0.0


class HookClock:
    """Time spent inside the producer's hooks (the outermost one of a nesting counts).

    Installed only with a budget: the two clock reads per hook are its own cost.
    """

    def __init__(self) -> None:
        self.hooks_ns = 0
        self._depth = threading.local()

    def timed(self, function: Callable[..., Any]) -> Callable[..., Any]:
        depth, clock = self._depth, time.perf_counter_ns

        def run(*args: Any, **kwargs: Any) -> Any:
            if getattr(depth, "n", 0):
                return function(*args, **kwargs)
            depth.n = 1
            started = clock()
            try:
                return function(*args, **kwargs)
            finally:
                self.hooks_ns += clock() - started
                depth.n = 0

        return run


class SnapshotSampler:
    """Decides per step whether snapshots are taken, and adapts the period to a budget."""

    def __init__(self, every: int = 1, budget: float | None = None,
                 clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self._now = clock
        self.min_period = max(int(every), 1)
        self.budget = budget
        self.period = self.min_period if budget is None else _power_of_two_at_least(self.min_period)
        self.clock = HookClock() if budget is not None else None
        self.totals = OverheadTotals()
        self._last_end: int | None = None
        self._window = OverheadTotals()
        self._hooks_seen = 0

    def wants(self, step: int) -> bool:
        return step % self.period == 0

    def snapshot_taken(self, nanoseconds: int) -> None:
        self.totals.snapshot_ns += nanoseconds
        self._window.snapshot_ns += nanoseconds

    def step_ended(self, step: int) -> None:
        """At a step end: book the step's wall time and, now and then, choose the period
        (nothing to do for a fixed period)."""
        if self.clock is None:
            return
        now = self._now()
        if self._last_end is None:  # the first window (setup) has no known start
            self._last_end = now
            return
        wall, self._last_end = now - self._last_end, now
        hooks = self.clock.hooks_ns - self._hooks_seen
        self._hooks_seen += hooks
        for totals in (self.totals, self._window):
            totals.wall_ns += wall
            totals.hooks_ns += hooks
            totals.steps += 1
            totals.snapshotted_steps += self.wants(step)
        window = self._window
        if window.steps >= ADAPT_STEPS or window.wall_ns >= ADAPT_NS:
            self.period = self._choose(window)
            self._window = OverheadTotals()

    def _choose(self, window: OverheadTotals) -> int:
        if not window.snapshotted_steps or not window.snapshot_ns:
            return self.period  # nothing learnt about snapshot cost in this window
        per_step_wall = window.wall_ns / window.steps
        per_snapshot = window.snapshot_ns / window.snapshotted_steps
        events = max(window.hooks_ns - window.snapshot_ns, 0) / window.steps
        headroom = self.budget * per_step_wall - events
        if headroom <= 0:
            return MAX_PERIOD
        return min(max(_power_of_two_at_least(per_snapshot / headroom), self.min_period), MAX_PERIOD)

    def report(self) -> dict[str, Any]:
        """What ``producer_stats`` and the session summary say about sampling."""
        found: dict[str, Any] = {"snapshot_every": self.period}
        if self.budget is not None:
            found.update(overhead_budget=self.budget, overhead_share=round(self.totals.share(), 4),
                         snapshot_share=round(self.totals.snapshot_share(), 4),
                         snapshotted_steps=self.totals.snapshotted_steps, timed_steps=self.totals.steps)
        return found


def sampling_note(report: dict[str, Any] | None) -> str:
    """One phrase for a summary line: how snapshots were sampled, and what it cost."""
    if not report:
        return ""
    every = report.get("snapshot_every", 1)
    budget = report.get("overhead_budget")
    if budget is None:
        return f"snapshots every {every} steps" if every > 1 else ""
    return (f"overhead budget {budget:.1%}: snapshots in {report.get('snapshotted_steps', 0)} of "
            f"{report.get('timed_steps', 0)} steps (now every {every}), producer share measured "
            f"{report.get('overhead_share', 0.0):.1%} (snapshots {report.get('snapshot_share', 0.0):.1%})")


def _power_of_two_at_least(value: float) -> int:
    period = 1
    while period < value and period < MAX_PERIOD:
        period *= 2
    return period
