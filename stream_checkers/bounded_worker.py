"""The Faust worker of ``trainwatch serve``: shutdown within a bound, quiet client logs.

Faust's shutdown commits offsets, flushes the producer and leaves the consumer group.
With a dead broker each of those waits on reconnects that never succeed (measured: not
stopped 90 s after SIGTERM once data had been processed), and an orchestrator then
kills the worker anyway.  `BoundedShutdownWorker` arms a deadline when it starts to
stop: if the shutdown has not finished `SHUTDOWN_DEADLINE_S` later, the process says
so in one line and exits with `EXIT_UNCLEAN_STOP`.  That is the ``kill -9`` the
checker already recovers from: what was consumed since the last offset commit is read
again by the next worker, which may repeat a violation (same id) but loses none.  Both
hooks used here (``stop`` and ``on_setup_root_logger``) are public members of mode's
``Worker``.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

import faust

from .broker_health import BrokerHealth
from .client_log_limit import ClientErrorRateLimit

#: Longest a shutdown may take from SIGTERM (or SIGINT) to exit.
SHUTDOWN_DEADLINE_S = 10.0
#: Exit code of a worker that stopped without a final offset commit (broker unreachable
#: when it stopped, or shutdown cut at the deadline); 0 is a clean stop.
EXIT_UNCLEAN_STOP = 2


class BoundedShutdownWorker(faust.Worker):
    """A ``faust.Worker`` whose stop is bounded and whose Kafka client logs are rate-limited."""

    def __init__(self, app: faust.App, broker: BrokerHealth, *args: Any,
                 deadline_s: float = SHUTDOWN_DEADLINE_S, **kwargs: Any) -> None:
        super().__init__(app, *args, **kwargs)
        self.broker = broker
        self.deadline_s = deadline_s
        self.client_log_limit = ClientErrorRateLimit(broker.bootstrap, lambda: broker.up)
        #: Whether the broker was unreachable when the worker began to stop.
        self.stopped_with_broker_down = False
        self._deadline: threading.Timer | None = None

    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        super().on_setup_root_logger(logger, level)
        for handler in logger.handlers:
            handler.addFilter(self.client_log_limit)

    async def stop(self) -> None:
        if self._deadline is None:
            self.stopped_with_broker_down = not self.broker.up
            self._deadline = threading.Timer(self.deadline_s, self._deadline_passed)
            self._deadline.daemon = True  # a finished shutdown must not wait for it
            self._deadline.start()
        await super().stop()

    def _deadline_passed(self) -> None:
        state = "reachable" if self.broker.up else "unreachable"
        print(f"trainwatch serve: shutdown did not finish within {self.deadline_s:g} s (broker at "
              f"{self.broker.bootstrap} {state}); exiting without a final offset commit: records consumed "
              "since the last commit are read again by the next worker", file=sys.stderr, flush=True)
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stdout.flush()
        os._exit(EXIT_UNCLEAN_STOP)
