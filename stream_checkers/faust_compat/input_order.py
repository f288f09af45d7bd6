"""Every input record reaches its agent, in offset order, and no commit passes one that did not.

Faust does not guarantee that a fetched record is handed to the agent.  Two places
throw records away after the fetcher has moved past them:

* ``FlowControlEvent.resume()`` empties every agent's buffer.  Table recovery resumes
  the input partitions and seeks them to their committed offsets while fetching is
  already running, and only *then* resumes flow control; records fetched in between
  are dropped from the buffer, and the fetcher carries on behind them.  A worker that
  restarts while input keeps arriving loses a few records in the middle of a
  partition (or at its end, where it looks like a fetch that stalled).
* A stream skips records that come out of its buffer while flow control is suspended
  or that were fetched in an earlier consumer generation, and *acknowledges* them, so
  Faust's offset commit can move past records that nobody handled.

Input offsets are contiguous (the events, window-ticks and step-summaries topics are
plain logs, written without transactions), so the agent can tell when that happened: each
partition's next expected offset is known — the committed offset at the start of an
assignment, then one past each record handled — and a record beyond it means the ones
in between were lost on the way.  The partition is then sought back to the expected
offset and records are dropped until it arrives.  The same expected offset caps what
may be committed (`commit_limit`), so a skipped record is read again after a crash.

Offsets below the expected one (a replay after a seek back to the committed offset)
are still handled: window records recognise batches they have already folded, trend
monitors steps they have already seen.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any, Callable, Iterable

from faust.types import TP

from .transport import FetchHighwaterProbe

log = logging.getLogger("trainwatch.checker")

#: A partition is sought back to a missing offset at most this often, so that the
#: stale records still in flight after one seek do not each trigger another.
RESEEK_INTERVAL_S = 1.0
#: After this many seeks back to the same offset without it arriving, the broker is asked
#: directly whether it still has the records (retention may have deleted them).
MAX_RESEEKS = 5


class InputOrder:
    """Per-partition expected offsets of the agents' input topics, and the repair of gaps."""

    def __init__(self, app: Any, topics: Iterable[str], probe: FetchHighwaterProbe | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self.probe = probe
        self.topics = frozenset(topics)
        self.clock = clock
        self._next: dict[TP, int] = {}
        self._generation: dict[TP, Any] = {}
        #: tp -> (offset sought back to, how many times, when last)
        self._reseeks: dict[TP, tuple[int, int, float]] = {}

    def expected(self, tp: TP) -> int | None:
        """The next offset the agent has to handle on ``tp``, if known in this assignment."""
        return self._next.get(tp)

    def in_order(self, tp: TP, offset: int, generation: Any) -> bool:
        """Cheap check for the common case: the record continues (or repeats) its partition.

        False means `admit` has to decide: first record of an assignment, or a gap.
        """
        expected = self._next.get(tp)
        if expected is None or offset > expected or self._generation.get(tp) != generation:
            return False
        if offset == expected:
            self._next[tp] = offset + 1
        return True

    async def admit(self, tp: TP, offset: int, generation: Any) -> bool:
        """Whether the agent should handle this record; seeks back over a gap when not."""
        if self._generation.get(tp) != generation or tp not in self._next:
            # A new assignment: Faust has sought the partition to its committed offset,
            # and every record from there on must come through.
            try:
                start = await self._start_offset(tp)
            except Exception:
                log.exception("%s[%s]: cannot read the committed offset; starting at %s",
                              tp.topic, tp.partition, offset)
                start = offset
            self._next[tp] = start
            self._generation[tp] = generation
            self._reseeks.pop(tp, None)
        return self._advance(tp, offset) or await self._repair_gap(tp, self._next[tp], offset)

    def _advance(self, tp: TP, offset: int) -> bool:
        expected = self._next[tp]
        if offset > expected:
            return False
        if offset == expected:
            self._next[tp] = offset + 1
            self._reseeks.pop(tp, None)
        return True

    async def _repair_gap(self, tp: TP, expected: int, offset: int) -> bool:
        target, count, last = self._reseeks.get(tp, (-1, 0, -math.inf))
        if target != expected:
            count = 0
        now = self.clock()
        if count and now - last < RESEEK_INTERVAL_S:
            return False  # a stale record from before the last seek
        try:
            if count >= MAX_RESEEKS and self.probe is not None:
                # Still missing after several re-reads: ask the broker itself what follows.
                loop = asyncio.get_running_loop()
                first = await loop.run_in_executor(None, self.probe.first_offset_from, tp, expected)
                if first is not None and first > expected:
                    log.error("%s[%s]: the broker has no records at offsets %s..%s (deleted by retention "
                              "or never written); continuing from %s", tp.topic, tp.partition,
                              expected, first - 1, first)
                    self._next[tp] = first
                    self._reseeks.pop(tp, None)
                    if self._advance(tp, offset):
                        return True
                    expected, count = first, 0
            log.warning("%s[%s]: offset %s arrived while %s was expected (records lost between fetch and "
                        "agent); re-reading from %s", tp.topic, tp.partition, offset, expected, expected)
            await self.app.consumer.seek(tp, expected)
        except Exception:  # e.g. revoked meanwhile; the stalled-partition guard tries again
            log.exception("%s[%s]: re-reading from %s failed", tp.topic, tp.partition, expected)
        self._reseeks[tp] = (expected, count + 1, now)
        return False

    async def retry_repairs(self) -> None:
        """Seek again where a gap repair has brought nothing for `RESEEK_INTERVAL_S`.

        Records still in Faust's fetch loop from before the seek move its read offset
        past the sought one, and it then drops the re-fetched records as already read;
        with nothing after them on the partition no later record shows the gap again.
        """
        if not self._reseeks or getattr(self.app, "rebalancing", False):
            return
        now = self.clock()
        for tp, (target, count, last) in list(self._reseeks.items()):
            if self._next.get(tp) != target or now - last < RESEEK_INTERVAL_S or count >= MAX_RESEEKS:
                continue  # repaired, recently sought, or left to the stalled-partition guard
            try:
                await self.app.consumer.seek(tp, target)
            except Exception:
                log.exception("%s[%s]: re-reading from %s failed", tp.topic, tp.partition, target)
            self._reseeks[tp] = (target, count + 1, now)

    def commit_limit(self, tp: TP, offset: int) -> int | None:
        """The highest offset that may be committed for ``tp`` when Faust wants ``offset``.

        Faust counts records skipped by a stream as acknowledged; the agent's expected
        offset is the end of what it has really handled, in order.  None: nothing yet.
        """
        if tp.topic not in self.topics:
            return offset
        expected = self._next.get(tp)
        if expected is None or self._generation.get(tp) != self.app.consumer_generation_id:
            return None  # nothing handled yet in this assignment
        return min(offset, expected)

    def forget(self, keep: Iterable[TP]) -> None:
        """Drop the state of partitions that are no longer assigned."""
        keep = set(keep)
        for tp in [tp for tp in self._next if tp not in keep]:
            self._next.pop(tp, None)
            self._generation.pop(tp, None)
            self._reseeks.pop(tp, None)

    async def _start_offset(self, tp: TP) -> int:
        consumer = self.app.consumer
        committed = await consumer.committed_offset(tp)
        if committed is not None and committed >= 0:
            return int(committed)
        return await self._earliest_offset(tp)  # consumer_auto_offset_reset="earliest"

    async def _earliest_offset(self, tp: TP) -> int:
        earliest = await self.app.consumer.earliest_offsets(tp)
        return int(earliest.get(tp) or 0)
