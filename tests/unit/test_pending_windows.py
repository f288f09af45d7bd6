"""Windows kept in memory hold back offset commits until they reach the table.

The worker-level consequence (a kill -9 loses and repeats nothing) is covered by the
restart tests in test_stream_checker_recovery.py; these pin the bookkeeping those rely on.
"""

from faust.types import TP

from stream_checkers.faust_compat.commit_gates import CommitGates
from stream_checkers.windows.pending import PERSIST_AFTER_S, PendingWindows

EVENTS = "trainwatch.events"


def _held(pending: PendingWindows, key: bytes, partition: int, offset: int, now: float, generation: int = 1,
          table_raw=None):
    pending.hold(key, {"k": key}, object(), partition, offset, now, generation, table_raw)


def test_commit_stops_at_the_first_batch_of_a_window_not_in_the_table():
    pending = PendingWindows(EVENTS)
    _held(pending, b"r:1", 0, offset=10, now=0.0)
    _held(pending, b"r:1", 0, offset=14, now=0.1)  # a later batch keeps the first offset
    _held(pending, b"r:3", 0, offset=12, now=0.2)
    assert pending.commit_limit(TP(EVENTS, 0), 20) == 10
    assert pending.commit_limit(TP(EVENTS, 1), 20) == 20  # other partitions are free
    assert pending.commit_limit(TP("trainwatch.window-ticks", 0), 20) == 20
    pending.release(b"r:1", 0)
    assert pending.commit_limit(TP(EVENTS, 0), 20) == 12
    pending.release(b"r:3", 0)
    assert pending.commit_limit(TP(EVENTS, 0), 20) == 20


def test_only_windows_open_long_enough_are_due_for_the_table():
    pending = PendingWindows(EVENTS)
    _held(pending, b"r:1", 0, offset=1, now=0.0)
    _held(pending, b"r:2", 0, offset=2, now=PERSIST_AFTER_S / 2)
    assert pending.due(0, PERSIST_AFTER_S / 4, generation=1) == []
    assert [e.key for e in pending.due(0, PERSIST_AFTER_S, generation=1)] == [b"r:1"]
    assert [e.key for e in pending.due(0, 2 * PERSIST_AFTER_S, generation=1)] == [b"r:1", b"r:2"]


def test_a_new_generation_or_a_changed_table_drops_what_was_kept():
    pending = PendingWindows(EVENTS)
    table_raw = b"old record"
    _held(pending, b"r:1", 0, offset=1, now=0.0, generation=1, table_raw=table_raw)
    assert pending.get(b"r:1", 0, 1, table_raw) is not None
    assert pending.get(b"r:1", 0, 1, b"restored record") is None  # the table moved on without us
    assert pending.commit_limit(TP(EVENTS, 0), 9) == 9
    _held(pending, b"r:1", 0, offset=1, now=0.0, generation=1)
    assert pending.get(b"r:1", 0, 2, None) is None  # rebalanced in between
    assert pending.entries() == []


def test_unassigned_partitions_are_forgotten():
    pending = PendingWindows(EVENTS)
    _held(pending, b"r:1", 0, offset=1, now=0.0)
    _held(pending, b"r:2", 1, offset=1, now=0.0)
    pending.keep_only({1})
    assert [e.key for e in pending.entries()] == [b"r:2"]


class _Fixed:
    def __init__(self, limit):
        self.limit = limit

    def commit_limit(self, tp, offset):
        return self.limit


def test_commit_gates_take_the_lowest_limit_and_nothing_means_nothing():
    tp = TP(EVENTS, 0)
    assert CommitGates(_Fixed(7), _Fixed(5)).commit_limit(tp, 9) == 5
    assert CommitGates(_Fixed(7), _Fixed(None)).commit_limit(tp, 9) is None
    assert CommitGates().commit_limit(tp, 9) == 9
