"""Restart the fetching of input partitions that stopped moving while records wait.

After a rebalance (a restarted worker joining, a survivor taking over a crashed
worker's partitions) records can stop reaching the agent for good: Faust drops the
records it had fetched when it empties the agents' buffers at the end of recovery
(`input_order`; with nothing after them on the partition no gap ever shows), and its
aiokafka consumer can end up never fetching some assigned partitions again
(faust-streaming issue #629).  Records keep arriving on those partitions and nobody
folds them: open windows then close by the grace timer and are reported as missing a
rank, and later steps are never checked at all.

The guard notices that from outside the consumer: an assigned input partition whose
next expected offset has not moved for `STALL_SECONDS`, while the partition's fetch
high-watermark (`FetchHighwaterProbe`) says records are waiting, is sought to that
offset again.  A seek resets the partition's fetch state, so the consumer fetches it
anew.  Re-reading is harmless: a batch already folded is recognised by its
``(rank, pid, seq)`` and a tick is idempotent.

The expected offset is the agent's own (`InputOrder`), never Faust's read offset: that
one also counts records that were fetched and then dropped from the agent's buffer
(see `input_order`), and seeking to it would skip them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

from faust.types import TP

from .transport import FetchHighwaterProbe
from .input_order import InputOrder

log = logging.getLogger("trainwatch.checker")

#: A partition whose position has not moved for this long is checked against its end.
STALL_SECONDS = 6.0


class StallGuard:
    """Tracks where each input partition's consumption stands and re-seeks stalled ones."""

    def __init__(self, app: Any, order: InputOrder, probe: FetchHighwaterProbe | None,
                 clock: Callable[[], float] = time.monotonic, stall_seconds: float = STALL_SECONDS) -> None:
        self.app = app
        self.order = order
        self.topics = order.topics
        self.probe = probe
        self.clock = clock
        self.stall_seconds = stall_seconds
        #: tp -> (expected offset, since when it has not moved)
        self._since: dict[TP, tuple[int | None, float]] = {}
        self._busy = False

    async def check(self) -> list[TP]:
        """Re-seek assigned input partitions that stalled with records waiting; returns them."""
        if self._busy or self.probe is None:
            return []
        consumer = self.app.consumer
        if getattr(self.app, "rebalancing", False) or getattr(self.app, "in_recovery", False) \
                or not getattr(consumer, "flow_active", True):
            self._since.clear()  # positions are being reset; judge them afresh afterwards
            return []
        try:
            assigned = {tp for tp in consumer.assignment() if tp.topic in self.topics}
        except Exception:
            return []
        now = self.clock()
        for tp in list(self._since):
            if tp not in assigned:
                self._since.pop(tp, None)
        self.order.forget(assigned)
        quiet: dict[TP, int] = {}
        committed_offsets = getattr(consumer, "_committed_offset", {})
        for tp in assigned:
            # A busy agent moves its expected offset with every record, so only a partition
            # whose records stopped reaching the agent stays put.  Before the first record
            # of an assignment the agent has to start at the committed offset (or at the
            # beginning: a re-read is harmless, a skipped record is not).
            expected = self.order.expected(tp)
            if expected is None:
                committed = committed_offsets.get(tp)
                expected = committed if isinstance(committed, int) and committed >= 0 else 0
            previous = self._since.get(tp)
            if previous is None or previous[0] != expected:
                self._since[tp] = (expected, now)
            elif now - previous[1] >= self.stall_seconds:
                quiet[tp] = expected
        if not quiet:
            return []
        self._busy = True
        try:
            loop = asyncio.get_running_loop()
            # fetched from where the agent waits, so the probe reads about one batch, not the log
            ends = await loop.run_in_executor(None, self.probe.end_offsets, list(quiet), dict(quiet))
            stalled = [tp for tp, expected in quiet.items() if ends.get(tp, 0) > expected]
            for tp in stalled:
                if tp not in consumer.assignment():
                    continue
                log.warning("%s[%s] has not moved from offset %s for %.0fs although the partition ends at %s; "
                            "seeking to restart its fetching", tp.topic, tp.partition, quiet[tp],
                            now - self._since[tp][1], ends[tp])
                await consumer.seek(tp, quiet[tp])
                self._since[tp] = (quiet[tp], self.clock())
            for tp in quiet:
                if tp not in stalled:  # caught up: look again after another quiet period
                    self._since[tp] = (quiet[tp], self.clock())
            return stalled
        except Exception:
            log.exception("stalled-partition check failed")
            return []
        finally:
            self._busy = False
