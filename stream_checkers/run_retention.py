"""Which runs still deserve their own metric series: the bound on the `run` label.

Every run gets a dozen labelled series on every checker that saw it.  A checker that
lives for months sees thousands of runs, and series are never dropped by the client
library, so /metrics (and each scrape, and the checker's memory) would grow with every
run ever checked.  A run's series are therefore removed

* ``ended_retention_s`` after the run announced its end (long enough for Prometheus
  to scrape the final values and for the alert windows to see them),
* ``idle_retention_s`` after the last sign of a run that never announced its end (a
  killed job: the "run silent" alert has long fired by then), and
* at once for the least recently active run when more than ``max_runs`` are tracked.

A run that shows up again after removal starts fresh series; Prometheus treats the
counters' restart from zero as a reset, which ``rate``/``increase`` already handle.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

DEFAULT_ENDED_RETENTION_S = 3600.0
DEFAULT_IDLE_RETENTION_S = 24 * 3600.0
DEFAULT_MAX_RUNS = 1000


@dataclass
class _RunActivity:
    last_seen: float
    ended_at: float | None = None


class RunRetention:
    """Last activity and end of each run, least recently active first."""

    def __init__(self, *, ended_retention_s: float = DEFAULT_ENDED_RETENTION_S,
                 idle_retention_s: float = DEFAULT_IDLE_RETENTION_S, max_runs: int = DEFAULT_MAX_RUNS) -> None:
        if max_runs < 1:
            raise ValueError("max_runs must be at least 1")
        self.ended_retention_s = ended_retention_s
        self.idle_retention_s = idle_retention_s
        self.max_runs = max_runs
        self._runs: OrderedDict[str, _RunActivity] = OrderedDict()

    def __len__(self) -> int:
        return len(self._runs)

    def __contains__(self, run: object) -> bool:
        return run in self._runs

    def touch(self, run: str, now: float) -> list[str]:
        """Record activity of ``run``; returns the runs evicted to stay within ``max_runs``."""
        activity = self._runs.get(run)
        if activity is None:
            self._runs[run] = _RunActivity(now)
        else:
            activity.last_seen = now
            self._runs.move_to_end(run)
        evicted = []
        while len(self._runs) > self.max_runs:
            oldest, _ = self._runs.popitem(last=False)
            evicted.append(oldest)
        return evicted

    def set_ended(self, run: str, ended: bool, now: float) -> None:
        activity = self._runs.get(run)
        if activity is not None:
            activity.ended_at = now if ended else None

    def expired(self, now: float) -> list[str]:
        """Runs past their retention, removed from tracking; the caller drops their series."""
        gone = [
            run for run, activity in self._runs.items()
            if (activity.ended_at is not None and now - activity.ended_at >= self.ended_retention_s)
            or now - activity.last_seen >= self.idle_retention_s
        ]
        for run in gone:
            del self._runs[run]
        return gone
