"""Open windows whose newest state lives only in memory, and the offset commits they hold back.

Writing a window's record to its changelogged table after every batch is the single
most expensive thing a worker does for a window that completes a few milliseconds
later: the first rank's batch of a step is serialised, produced to the changelog and
stored by the broker, only to be replaced by the closed marker when the last rank's
batch arrives.  So an open window is first kept here, and written to the table only
once it has waited longer than `PERSIST_AFTER_S` (the next message of its partition
writes it), or never if it closes before that.

What makes that safe is the commit cap: no input offset is committed past the first
batch of a window that is not in the table yet (`commit_limit`).  After a crash the
replacement worker reads those batches again and folds them into a window it builds
afresh; batches of windows that did reach the table are recognised as already folded
by the record's ``seen`` list, as after any restart.

Entries belong to one consumer generation: after a rebalance the partition may have
been owned, advanced and given back in between, so what was kept is dropped and the
input is read again from the committed offset, which the cap kept before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class TopicPartition(Protocol):
    """What a commit offset is keyed by (Faust's ``TP`` has these fields)."""

    topic: str
    partition: int

#: A window still open after this long is written to the table by the next message of
#: its partition (well below any grace period, so restarts replay little).
PERSIST_AFTER_S = 0.5


@dataclass
class PendingWindow:
    key: bytes
    record: Any
    window: Any
    partition: int
    first_offset: int  # the events-topic offset of the first batch not in the table
    since: float  # when that batch was folded
    generation: Any
    table_raw: Any  # what the table held for the key when the entry was made


class PendingWindows:
    """Per events partition, the windows not yet written to the table, oldest first."""

    def __init__(self, events_topic: str) -> None:
        self.events_topic = events_topic
        self._by_partition: dict[int, dict[bytes, PendingWindow]] = {}

    def get(self, key: bytes, partition: int, generation: Any, table_raw: Any) -> PendingWindow | None:
        """The in-memory window, if it is still newer than the table's and of this generation."""
        entries = self._by_partition.get(partition)
        entry = entries.get(key) if entries else None
        if entry is None:
            return None
        if entry.generation != generation or entry.table_raw is not table_raw:
            self.drop_partition(partition)  # the partition changed hands in between
            return None
        return entry

    def hold(self, key: bytes, record: Any, window: Any, partition: int, offset: int, now: float,
             generation: Any, table_raw: Any) -> None:
        """Keep the window's new state in memory; its first unsaved offset stays the oldest."""
        entries = self._by_partition.setdefault(partition, {})
        entry = entries.get(key)
        if entry is not None and entry.generation == generation:
            entry.record, entry.window = record, window
            return
        entries[key] = PendingWindow(key, record, window, partition, offset, now, generation, table_raw)

    def release(self, key: bytes, partition: int) -> None:
        """The window was written to the table (or closed there)."""
        entries = self._by_partition.get(partition)
        if entries is not None:
            entries.pop(key, None)

    def due(self, partition: int, now: float, generation: Any) -> list[PendingWindow]:
        """Entries of ``partition`` that have waited `PERSIST_AFTER_S`, to be written now."""
        entries = self._by_partition.get(partition)
        if not entries:
            return []
        oldest = next(iter(entries.values()))  # dicts keep insertion order: the oldest first
        if now - oldest.since < PERSIST_AFTER_S and oldest.generation == generation:
            return []
        if any(entry.generation != generation for entry in entries.values()):
            self.drop_partition(partition)
            return []
        return [entry for entry in entries.values() if now - entry.since >= PERSIST_AFTER_S]

    def entries(self) -> list[PendingWindow]:
        return [entry for entries in self._by_partition.values() for entry in entries.values()]

    def drop_partition(self, partition: int) -> None:
        self._by_partition.pop(partition, None)

    def keep_only(self, partitions: set[int]) -> None:
        """Forget partitions that are no longer assigned to this worker."""
        for partition in [p for p in self._by_partition if p not in partitions]:
            self.drop_partition(partition)

    def commit_limit(self, tp: TopicPartition, offset: int) -> int | None:
        """No events offset is committed past the first batch of a window not in the table."""
        if tp.topic != self.events_topic:
            return offset
        entries = self._by_partition.get(tp.partition)
        if not entries:
            return offset
        return min(offset, min(entry.first_offset for entry in entries.values()))

