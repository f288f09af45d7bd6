"""One log line per interval, with a count, for the Kafka clients' repeated errors.

aiokafka (Faust's consumer and producer) and kafka-python (the fetch high-watermark probe)
log every failed reconnect and request: with a dead broker that was about 6,600 ERROR
lines in 90 s, which buries everything else and fills disks.  The filter sits on the root
logger's handlers, so it sees the records of every client logger in one place.  The first
warning or error of a burst is shown as it is (it names the cause); later ones within
`SUMMARY_INTERVAL_S` are counted, and the first one after the interval is replaced by one
summary line::

    broker unreachable at HOST:PORT for 30 s (N errors suppressed); latest: ...

A burst ends after a quiet interval with no client warning at all.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

#: Loggers of the Kafka client libraries (and their children).
CLIENT_LOGGERS = ("aiokafka", "kafka")
SUMMARY_INTERVAL_S = 30.0
#: Set on a judged record: each handler the record reaches must not count it again.
VERDICT_ATTRIBUTE = "trainwatch_passes_rate_limit"


def from_kafka_client(name: str) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in CLIENT_LOGGERS)


class ClientErrorRateLimit(logging.Filter):
    """Passes the first client warning of a burst, then one summary per interval."""

    def __init__(self, bootstrap: str, broker_up: Callable[[], bool], *,
                 interval_s: float = SUMMARY_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.bootstrap = bootstrap
        self.broker_up = broker_up
        self.interval_s = interval_s
        self.clock = clock
        self._lock = threading.Lock()  # Faust's consumer logs from its own thread
        self._burst_started: float | None = None
        self._last_seen = 0.0
        self._last_shown = 0.0
        self._suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not from_kafka_client(record.name):
            return True
        judged = getattr(record, VERDICT_ATTRIBUTE, None)
        if judged is not None:  # a second handler sees the first one's verdict
            return judged
        with self._lock:
            verdict = self._judge(record)
        setattr(record, VERDICT_ATTRIBUTE, verdict)
        return verdict

    def _judge(self, record: logging.LogRecord) -> bool:
        now = self.clock()
        quiet = self._burst_started is None or now - self._last_seen >= self.interval_s
        self._last_seen = now
        if quiet:
            self._burst_started = self._last_shown = now
            self._suppressed = 0
            return True
        if now - self._last_shown < self.interval_s:
            self._suppressed += 1
            return False
        latest = record.getMessage()
        lasted = now - (self._burst_started or now)
        if self.broker_up():
            record.msg = "Kafka client errors with the broker at %s for %.0f s (%d errors suppressed); latest: %s"
        else:
            record.msg = "broker unreachable at %s for %.0f s (%d errors suppressed); latest: %s"
        record.args = (self.bootstrap, lasted, self._suppressed, latest)
        record.exc_info = record.exc_text = record.stack_info = None
        self._last_shown = now
        self._suppressed = 0
        return True
