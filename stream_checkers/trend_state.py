"""Per-run trend monitor state in the ``trends`` table, decoded once and written sparingly.

A run's step summaries all arrive on one partition of the summaries topic, so one
worker owns the run's `TrendMonitor` and the set of its live ranks (the liveness gauge
rides on the summaries for that reason).  Decoding the monitor on every summary would
dominate the trend agent, so the decoded state is kept while the table still holds the
bytes this worker wrote; quiet steps are persisted only every `WRITE_EVERY`.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from typing import Any

import msgpack

from invariants.events import RUN_END_META, RUN_START_META
from invariants.trends import TrendMonitor, TrendRules

#: Quiet steps are persisted every this many summaries; steps with an alert or a run
#: start/end always are (so a replay cannot repeat an alert).
WRITE_EVERY = 8


class TrendStates:
    def __init__(self, table: MutableMapping[bytes, Any], rules: TrendRules) -> None:
        self.table = table
        self.rules = rules
        self._cache: dict[bytes, tuple[bytes, TrendMonitor, set[int]]] = {}
        self._writes: dict[bytes, int] = {}

    def get(self, run: str) -> tuple[TrendMonitor, set[int]]:
        """The run's monitor and live ranks, decoded only when the table holds bytes we did not write."""
        key = run.encode()
        raw = self.table.get(key)
        cached = self._cache.get(key)
        if cached is not None and raw is not None and cached[0] is raw:
            return cached[1], cached[2]
        state = msgpack.unpackb(raw, raw=False) if raw is not None else {}
        if "monitor" in state:
            return TrendMonitor.from_dict(state["monitor"], self.rules), set(state.get("live", ()))
        return TrendMonitor(run, self.rules), set()

    def put(self, run: str, monitor: TrendMonitor, live: set[int], *, must: bool) -> None:
        key = run.encode()
        if not must:
            count = self._writes.get(key, 0)
            self._writes[key] = count + 1
            must = count % WRITE_EVERY == 0
        if must:
            raw = msgpack.packb({"monitor": monitor.to_dict(), "live": sorted(live)})
            self.table[key] = raw
            self._cache[key] = (raw, monitor, live)


def apply_lifecycle(live: set[int], lifecycle: Iterable[Any]) -> bool:
    """Fold [rank, "run_start"|"run_end"] marks into the live ranks; True if any were given."""
    changed = False
    for rank, what in lifecycle:
        changed = True
        if what == RUN_START_META:
            live.add(int(rank))
        elif what == RUN_END_META:
            live.discard(int(rank))
    return changed
