"""The life of a step window on one worker: fold, dedupe, complete or wait, close, evict.

Every decision about a window lives here and nothing here does I/O: the table is any
mutable mapping of bytes (Faust's changelogged `Table` in a worker, a dict in tests),
the clock is injected, and what has to be sent (violations, the step summary, ticks)
is handed back to the caller.  So a window's whole life — a replayed batch recognised
by its (rank, pid, seq), a batch for a closed step counted as late, a window closed
when complete or when its grace ran out, violation ids remembered so a replay after a
crash never reports twice, markers evicted after their retention — is tested with no
broker, like the engine below it.

The caller's part of the contract: table writes happen only while a message of the
window's partition is being handled (Faust's rule), which is why closing and evicting
go through ticks (`requests`) that come back as messages (`on_tick`).
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import msgpack

from invariants.events import RUN_END_META, RUN_START_META
from invariants.step_summary import StepSummaryBuilder

from ..engine_port import EnginePort
from .grace import grace_expired
from .pending import PendingWindows
from .record import WindowRecord, window_key

#: A close or evict request for a window is not repeated within this many seconds.
TICK_RESEND_SECONDS = 2.0
#: The run state is bookkeeping (late answers after marker eviction); the window markers
#: carry what recovery needs, so it is written to its table only every few closes.
RUN_STATE_WRITE_EVERY = 16

CLOSE = b"close"
EVICT = b"evict"


class Fold(enum.Enum):
    DUPLICATE = "duplicate"  # already folded (a replay after a restart or takeover)
    LATE = "late"  # its step is closed: counted and dropped
    REJECTED = "rejected"  # the engine refused it
    HELD = "held"  # folded; the window waits for more ranks
    COMPLETE = "complete"  # folded; every rank reported, the window closes now


@dataclass
class FoldResult:
    outcome: Fold
    key: bytes
    record: WindowRecord | None = None
    window: Any = None
    error: Exception | None = None


@dataclass
class Verdict:
    """What closing a window found; `mark_closed` turns it into the closed marker."""

    fresh: list[dict[str, Any]]  # violations not emitted by an earlier close of this window
    summary_payload: bytes  # the step summary with the window's run_start/run_end marks
    missing_ranks: bool
    missing_workers: bool
    coverage: Any
    seconds: float


@dataclass(frozen=True)
class TickRequest:
    key: bytes
    partition: int
    op: bytes


@dataclass
class _Cache:
    """Decoded window records, valid while the table still holds the bytes we wrote."""

    entries: dict[bytes, tuple[bytes, WindowRecord, Any]] = field(default_factory=dict)

    def get(self, key: bytes, raw: bytes | None) -> tuple[WindowRecord, Any] | None:
        entry = self.entries.get(key)
        if entry is not None and raw is not None and entry[0] is raw:
            return entry[1], entry[2]
        return None

    def put(self, key: bytes, raw: bytes, record: WindowRecord, window: Any) -> None:
        self.entries[key] = (raw, record, window)

    def drop(self, key: bytes) -> None:
        self.entries.pop(key, None)


def lifecycle_marks(events: list[Any]) -> list[str]:
    """The run_start/run_end announcements in a batch, in order."""
    return [event.what for event in events
            if event.KIND == "meta" and event.what in (RUN_START_META, RUN_END_META)]


class WindowLifecycle:
    """Open windows of the partitions this worker reads, and the markers of closed ones."""

    def __init__(self, engine: EnginePort, windows: MutableMapping[bytes, Any],
                 run_states: MutableMapping[bytes, Any], *, events_topic: str, grace_seconds: float,
                 closed_retention_seconds: float, clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self.windows = windows
        self.run_states = run_states
        self.grace_seconds = grace_seconds
        self.closed_retention_seconds = closed_retention_seconds
        self.clock = clock
        #: open windows not written to the table yet; they hold back offset commits
        self.pending = PendingWindows(events_topic)
        self._cache = _Cache()
        self._run_cache: dict[bytes, tuple[bytes, Any]] = {}
        self._closes_per_run: dict[bytes, int] = {}
        self._ticks_sent: dict[bytes, float] = {}
        #: events partition -> unread records (last lag update), newest producer time read
        self._lags: dict[int, int] = {}
        self._event_times: dict[int, float] = {}
        #: Index of the table for the timer: key -> (last batch time, partition, newest
        #: producer time) of open windows, (close time, partition) of closed ones.
        self._open: dict[bytes, tuple[float, int, float]] = {}
        self._closed: dict[bytes, tuple[float, int]] = {}

    # ------------------------------------------------------------------ batches
    def fold(self, batch: Any, *, partition: int, offset: int, generation: Any,
             producer_ts: float | None) -> FoldResult:
        key = window_key(batch.run, batch.step)
        raw = self.windows.get(key)
        record, window = self._current(key, raw, partition, generation)
        pid = batch.pid
        if not isinstance(pid, int) or isinstance(pid, bool):
            pid = batch.events[0].pid if batch.events else 0
        if record is not None and record.has_seen(batch.rank, pid, batch.seq):
            return FoldResult(Fold.DUPLICATE, key)
        now = self.clock()
        if record is None:
            _, run_state = self._run_state(batch.run, partition)
            if self.engine.is_closed(run_state, batch.step):
                return FoldResult(Fold.LATE, key)  # its closed marker was already evicted
            window = self.engine.open(batch.run, batch.step)
            record = WindowRecord(batch.run, batch.step, partition, now, now,
                                  builder=StepSummaryBuilder(batch.run, batch.step))
        if record.closed:
            return FoldResult(Fold.LATE, key)
        try:
            self.engine.add(window, batch)
        except Exception as exc:
            return FoldResult(Fold.REJECTED, key, error=exc)
        record.summary_builder().add_batch(batch)
        record.seen.append([batch.rank, pid, batch.seq])
        record.last_batch_at = now
        if producer_ts:
            record.newest_producer_ts = max(record.newest_producer_ts, producer_ts)
        record.lifecycle.extend([batch.rank, what] for what in lifecycle_marks(batch.events))
        if self.engine.complete(window):
            return FoldResult(Fold.COMPLETE, key, record, window)
        # written to the table only if it stays open a while (`windows.pending`)
        self.pending.hold(key, record, window, partition, offset, now, generation, raw)
        self._index(key, record)
        return FoldResult(Fold.HELD, key, record, window)

    def persist_due(self, partition: int, generation: Any) -> None:
        """Write the partition's windows that stayed open a while."""
        for entry in self.pending.due(partition, self.clock(), generation):
            self._store(entry.key, entry.record, entry.window)

    # ------------------------------------------------------------------ closing
    def evaluate(self, record: WindowRecord, window: Any, *, forced: bool) -> Verdict:
        started = time.perf_counter()
        # a forced close is about missing ranks, or only about DataLoader workers that never reported
        missing_ranks = forced and bool(self.engine.missing_ranks(window))
        missing_workers = forced and self.engine.missing_workers(window) > 0
        run_key, run_state = self._run_state(record.run, record.partition)
        coverage = self.engine.coverage(window)
        violations = self.engine.evaluate(window, run_state)
        seconds = time.perf_counter() - started
        self.engine.compact_run_state(run_state)
        closes = self._closes_per_run.get(run_key, 0)
        self._closes_per_run[run_key] = closes + 1
        if closes % RUN_STATE_WRITE_EVERY == 0:
            raw_run_state = self.engine.dump_run_state(run_state)
            self.run_states[run_key] = raw_run_state
            self._run_cache[run_key] = (raw_run_state, run_state)
        summary = record.summary_builder().summary()
        payload = msgpack.packb({"summary": summary.to_dict(), "lifecycle": record.lifecycle})
        fresh = [v for v in violations if v.get("id") not in record.emitted]
        return Verdict(fresh, payload, missing_ranks, missing_workers, coverage, seconds)

    def mark_closed(self, key: bytes, record: WindowRecord, verdict: Verdict) -> None:
        """Replace the window by its closed marker, which remembers what it emitted."""
        record.emitted.extend(v["id"] for v in verdict.fresh)
        record.closed_at = self.clock()
        record.summary = None
        record.builder = None
        self._store(key, record, None)
        self._ticks_sent.pop(key, None)

    # ------------------------------------------------------------------ ticks
    def requests(self, now: float, *, evictions: bool) -> list[TickRequest]:
        """Close requests for windows whose grace ran out; eviction requests if asked."""
        due = [TickRequest(key, partition, CLOSE)
               for key, (last_batch_at, partition, newest_producer_ts) in self._open.items()
               if self._grace_expired(now, last_batch_at, newest_producer_ts, partition)]
        if evictions:
            due += [TickRequest(key, partition, EVICT) for key, (closed_at, partition) in self._closed.items()
                    if now - closed_at >= self.closed_retention_seconds]
        sendable = []
        for request in due:
            if now - self._ticks_sent.get(request.key, -math.inf) >= TICK_RESEND_SECONDS:
                self._ticks_sent[request.key] = now
                sendable.append(request)
        return sendable

    def on_tick(self, key: bytes, op: bytes, partition: int,
                generation: Any) -> tuple[WindowRecord, Any] | None:
        """A tick came back on the window's partition: the window to force-close, if any."""
        raw = self.windows.get(key)
        record, window = self._current(key, raw, partition, generation)
        if record is None:
            return None
        now = self.clock()
        if op == CLOSE and not record.closed and self._grace_expired(
                now, record.last_batch_at, record.newest_producer_ts, record.partition):
            return record, window
        if op == EVICT and record.closed and now - (record.closed_at or 0.0) >= self.closed_retention_seconds:
            del self.windows[key]
            self._forget(key)
        return None

    # ------------------------------------------------------------------ partitions
    def partition_read(self, partition: int, producer_ts: float | None) -> None:
        if producer_ts:
            self._event_times[partition] = max(self._event_times.get(partition, 0.0), producer_ts)

    def partition_lag(self, partition: int, lag: int) -> None:
        self._lags[partition] = lag

    def partition_gone(self, partition: int) -> None:
        self._lags.pop(partition, None)
        self._event_times.pop(partition, None)

    def rescan(self, owned: set[int] | None) -> None:
        """Rebuild the index from the table (restored or revoked partitions)."""
        if owned is not None:
            self.pending.keep_only(owned)
        present = set()
        for entry in self.pending.entries():
            present.add(entry.key)
            self._index(entry.key, entry.record)
        for key, raw in list(self.windows.items()):
            if key in present:
                continue
            try:
                record, _ = self._load(key, raw)
            except Exception:
                continue
            if record is not None:
                present.add(key)
                self._index(key, record)
        for key in (set(self._open) | set(self._closed) | set(self._cache.entries)) - present:
            self._forget(key)

    @property
    def open_count(self) -> int:
        return len(self._open)

    # ------------------------------------------------------------------ internals
    def _grace_expired(self, now: float, last_batch_at: float, newest_producer_ts: float, partition: int) -> bool:
        return grace_expired(now=now, last_batch_at=last_batch_at, newest_producer_ts=newest_producer_ts,
                             grace=self.grace_seconds, partition_lag=self._lags.get(partition),
                             partition_event_time=self._event_times.get(partition))

    def _current(self, key: bytes, raw: Any, partition: int, generation: Any) -> tuple[WindowRecord | None, Any]:
        """The window as this worker knows it: newer in memory than in the table, or from the table."""
        pending = self.pending.get(key, partition, generation, raw)
        if pending is not None:
            return pending.record, pending.window
        return self._load(key, raw)

    def _load(self, key: bytes, raw: Any) -> tuple[WindowRecord | None, Any]:
        if raw is None:
            return None, None
        cached = self._cache.get(key, raw)
        if cached is not None:
            return cached
        record = WindowRecord.from_bytes(raw)
        window = self.engine.load_window(record.engine_state) if record.engine_state is not None else None
        self._cache.put(key, raw, record, window)
        return record, window

    def _store(self, key: bytes, record: WindowRecord, window: Any) -> None:
        record.engine_state = self.engine.dump_window(window) if window is not None else None
        raw = record.to_bytes()
        self.windows[key] = raw
        self._cache.put(key, raw, record, window)
        self.pending.release(key, record.partition)
        self._index(key, record)

    def _index(self, key: bytes, record: WindowRecord) -> None:
        if record.closed:
            self._open.pop(key, None)
            self._closed[key] = (record.closed_at or 0.0, record.partition)
        else:
            self._open[key] = (record.last_batch_at, record.partition, record.newest_producer_ts)

    def _forget(self, key: bytes) -> None:
        self._cache.drop(key)
        self._ticks_sent.pop(key, None)
        self._open.pop(key, None)
        self._closed.pop(key, None)

    def _run_state(self, run: str, partition: int) -> tuple[bytes, Any]:
        # Steps of one run are spread over partitions; each partition keeps its own run
        # state so that it moves with the partition on a rebalance.
        key = f"{run}\x00{partition}".encode()
        raw = self.run_states.get(key)
        cached = self._run_cache.get(key)
        if cached is not None and raw is not None and cached[0] is raw:
            return key, cached[1]
        return key, (self.engine.load_run_state(raw) if raw is not None else self.engine.new_run_state(run))
