"""A step window's whole life on one worker, with a dict for a table and a number for a clock."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from invariants.codec import encode_batch
from stream_checkers.engine_port import EnginePort
from stream_checkers.windows.lifecycle import CLOSE, EVICT, TICK_RESEND_SECONDS, Fold, WindowLifecycle
from stream_checkers.windows.pending import PERSIST_AFTER_S
from tests.support.kafka import synthetic_step_batch

GRACE = 3.0
RETENTION = 60.0
PARTITION = 0
GENERATION = 1


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def engine() -> EnginePort:
    return EnginePort.load(None)


class Worker:
    """One worker's lifecycle over tables that outlive it (as changelogged tables do)."""

    def __init__(self, engine: EnginePort, clock: Clock, windows: dict | None = None,
                 run_states: dict | None = None) -> None:
        self.windows = {} if windows is None else windows
        self.run_states = {} if run_states is None else run_states
        self.lifecycle = WindowLifecycle(engine, self.windows, self.run_states, events_topic="events",
                                         grace_seconds=GRACE, closed_retention_seconds=RETENTION, clock=clock)
        self.engine = engine
        self.offset = 0

    def fold(self, batch: dict):
        self.offset += 1
        decoded = self.engine.decode(encode_batch(batch), 1 << 20)
        return self.lifecycle.fold(decoded, partition=PARTITION, offset=self.offset, generation=GENERATION,
                                   producer_ts=None)

    def close(self, folded_or_pair, *, forced: bool):
        record, window = folded_or_pair
        verdict = self.lifecycle.evaluate(record, window, forced=forced)
        self.lifecycle.mark_closed(record_key(record), record, verdict)
        return verdict


def record_key(record) -> bytes:
    return f"{record.run}:{record.step}".encode()


def step(rank: int, step_index: int = 1, **kwargs) -> dict:
    return synthetic_step_batch("run-a", rank, 2, step_index, seq=step_index, **kwargs)


def test_a_window_completes_when_every_rank_reported_and_later_copies_are_late_or_replays(engine):
    clock = Clock()
    worker = Worker(engine, clock)
    assert worker.fold(step(0)).outcome is Fold.HELD
    assert worker.fold(step(0)).outcome is Fold.DUPLICATE  # redelivered: folded once only
    completed = worker.fold(step(1))
    assert completed.outcome is Fold.COMPLETE
    verdict = worker.close((completed.record, completed.window), forced=False)
    assert verdict.fresh == [] and not verdict.missing_ranks
    assert worker.fold(step(1)).outcome is Fold.DUPLICATE  # a replay of a folded batch
    assert worker.fold(synthetic_step_batch("run-a", 1, 2, 1, seq=7)).outcome is Fold.LATE  # new, for a closed step


def test_violations_are_emitted_once_even_when_a_restarted_worker_reads_the_step_again(engine):
    clock = Clock()
    first = Worker(engine, clock)
    first.fold(step(0, digest="x3:aaaa"))
    completed = first.fold(step(1, digest="x3:bbbb"))
    verdict = first.close((completed.record, completed.window), forced=False)
    assert verdict.fresh, "diverging replicas must violate a cross-rank rule"
    emitted = {v["id"] for v in verdict.fresh}
    # The worker dies; its replacement restores the table and reads the partition again.
    second = Worker(engine, clock, first.windows, first.run_states)
    assert second.fold(step(0, digest="x3:aaaa")).outcome is Fold.DUPLICATE
    assert second.fold(step(1, digest="x3:bbbb")).outcome is Fold.DUPLICATE
    record, _ = second.lifecycle._load(b"run-a:1", second.windows[b"run-a:1"])
    assert set(record.emitted) == emitted


def test_a_rank_that_never_reports_closes_the_window_after_the_grace_through_a_tick(engine):
    clock = Clock()
    worker = Worker(engine, clock)
    worker.fold(step(0))
    lifecycle = worker.lifecycle
    clock.now += GRACE - 0.1
    assert lifecycle.requests(clock.now, evictions=False) == []
    clock.now += 0.2
    [request] = lifecycle.requests(clock.now, evictions=False)
    assert (request.key, request.op, request.partition) == (b"run-a:1", CLOSE, PARTITION)
    assert lifecycle.requests(clock.now + TICK_RESEND_SECONDS / 2, evictions=False) == []  # not resent yet
    closing = lifecycle.on_tick(request.key, request.op, PARTITION, GENERATION)
    assert closing is not None
    verdict = worker.close(closing, forced=True)
    assert verdict.missing_ranks
    assert any(v["relation"] == "AllRanksReport" for v in verdict.fresh)
    assert lifecycle.open_count == 0
    # the closed marker stays for its retention, then an evict tick removes it
    assert lifecycle.requests(clock.now + RETENTION - 1, evictions=True) == []
    clock.now += RETENTION + 0.5
    [evict] = lifecycle.requests(clock.now, evictions=True)
    assert evict.op == EVICT
    assert lifecycle.on_tick(evict.key, evict.op, PARTITION, GENERATION) is None
    assert b"run-a:1" not in worker.windows
    # after eviction the run state still knows the step was judged
    assert worker.fold(step(1)).outcome is Fold.LATE


def test_a_tick_for_a_window_that_heard_from_a_rank_since_does_not_close_it(engine):
    clock = Clock()
    worker = Worker(engine, clock)
    worker.fold(step(0))
    clock.now += GRACE + 1
    [request] = worker.lifecycle.requests(clock.now, evictions=False)
    worker.fold(synthetic_step_batch("run-a", 0, 2, 1, seq=2, end=False))  # rank 0 is still talking
    assert worker.lifecycle.on_tick(request.key, request.op, PARTITION, GENERATION) is None


def test_the_grace_waits_while_the_partition_has_unread_records(engine):
    clock = Clock()
    worker = Worker(engine, clock)
    worker.lifecycle.partition_read(PARTITION, 50.0)
    worker.lifecycle.partition_lag(PARTITION, 500)  # the missing batch may sit unread
    decoded = engine.decode(encode_batch(step(0)), 1 << 20)
    worker.lifecycle.fold(decoded, partition=PARTITION, offset=1, generation=GENERATION, producer_ts=50.0)
    clock.now += GRACE * 10
    assert worker.lifecycle.requests(clock.now, evictions=False) == []
    worker.lifecycle.partition_read(PARTITION, 50.0 + GRACE)  # records stamped a grace later were read
    assert [r.op for r in worker.lifecycle.requests(clock.now, evictions=False)] == [CLOSE]


def test_an_open_window_reaches_the_table_only_after_a_while_and_caps_the_commit_until_then(engine):
    clock = Clock()
    worker = Worker(engine, clock)
    worker.fold(step(0))
    pending = worker.lifecycle.pending

    @dataclass(frozen=True)
    class TP:
        topic: str
        partition: int

    assert b"run-a:1" not in worker.windows
    assert pending.commit_limit(TP("events", PARTITION), 10) == 1  # not past the unsaved batch
    worker.lifecycle.persist_due(PARTITION, GENERATION)
    assert b"run-a:1" not in worker.windows  # it may still complete in a moment
    clock.now += PERSIST_AFTER_S
    worker.lifecycle.persist_due(PARTITION, GENERATION)
    assert b"run-a:1" in worker.windows
    assert pending.commit_limit(TP("events", PARTITION), 10) == 10
    # a replacement worker finishes the window from the table
    replacement = Worker(engine, clock, worker.windows, worker.run_states)
    assert replacement.fold(step(0)).outcome is Fold.DUPLICATE
    assert replacement.fold(step(1)).outcome is Fold.COMPLETE
