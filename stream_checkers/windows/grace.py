"""When a window's grace period has run out: by wall clock when caught up, by event time
when records are still waiting.

The grace period exists for a rank that stopped reporting.  Counted in wall-clock time
from the window's last batch it misfires whenever the worker is behind its input: after
a restart, a rebalance or a burst, the batch that would complete a window can sit unread
in the partition while the clock runs.  So while the window's partition has unread
records, time is measured in the producers' timestamps of what has been read: the
window expires once records stamped ``grace`` seconds after its newest batch have been
consumed.  A caught-up partition (or one whose lag is unknown) falls back to the wall
clock, which is what catches a rank that is really gone.
"""

from __future__ import annotations


def grace_expired(*, now: float, last_batch_at: float, newest_producer_ts: float, grace: float,
                  partition_lag: int | None, partition_event_time: float | None) -> bool:
    if now - last_batch_at < grace:
        return False
    if not partition_lag or not newest_producer_ts or partition_event_time is None:
        return True
    return partition_event_time - newest_producer_ts >= grace
