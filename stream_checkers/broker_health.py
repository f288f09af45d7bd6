"""Whether this worker can reach Kafka: the ground truth behind ``trainwatch_broker_up``.

With a dead broker Faust and aiokafka retry forever and say so only in their logs; the
worker's own view (its assignment, the last fetched high-watermarks) stays frozen at the
moment the broker died, so 4 owned partitions and a lag of 0 would look healthy.  A probe
that asks the cluster for its metadata every `PROBE_INTERVAL_S` gives the worker a view of
the broker that does not depend on what the consumer last saw.

The probe uses a short-lived `AIOKafkaAdminClient` (public aiokafka API) per attempt:
bootstrap, then a Metadata request to a broker the cluster advertises, then close.  A
fresh client leaves no background reconnect loop behind while the broker is down, and a
cluster whose advertised address is unreachable counts as down, as it is for the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, Callable, Mapping

log = logging.getLogger("trainwatch.checker")

#: Seconds between probes; an outage shows in ``/metrics`` at most about this late.
PROBE_INTERVAL_S = 2.0
#: A probe that gets no answer within this long counts as a failure.
PROBE_TIMEOUT_S = 5.0


class BrokerHealth:
    """The last probe's verdict, with the time it changed and the error that made it fail."""

    def __init__(self, bootstrap_servers: list[str], client_kwargs: Mapping[str, Any] | None = None, *,
                 timeout_s: float = PROBE_TIMEOUT_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.bootstrap_servers = list(bootstrap_servers)
        self.client_kwargs = dict(client_kwargs or {})
        self.timeout_s = timeout_s
        self.clock = clock
        #: The worker starts only after its topics were created or checked on the broker.
        self.up = True
        self.since = clock()
        self.last_error = ""

    @classmethod
    def of_app(cls, app: Any, bootstrap_servers: list[str]) -> "BrokerHealth":
        """A probe that connects as the app's own clients do (TLS, SASL credentials)."""
        from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

        return cls(bootstrap_servers, credentials_to_aiokafka_auth(app.conf.broker_credentials))

    @property
    def bootstrap(self) -> str:
        return ",".join(self.bootstrap_servers)

    async def probe(self) -> bool:
        """Ask the cluster for its metadata once; record and return whether it answered."""
        try:
            await asyncio.wait_for(self._describe_cluster(), timeout=self.timeout_s)
        except asyncio.TimeoutError:
            self._record(False, f"no metadata answer within {self.timeout_s:g}s")
        except Exception as exc:  # aiokafka raises its own errors and OSErrors alike
            text = str(exc)  # aiokafka's errors already start with their class name
            self._record(False, text if text.startswith(type(exc).__name__) else f"{type(exc).__name__}: {text}")
        else:
            self._record(True, "")
        return self.up

    async def _describe_cluster(self) -> None:
        from aiokafka.admin import AIOKafkaAdminClient

        timeout_ms = int(self.timeout_s * 1000)
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap_servers, request_timeout_ms=timeout_ms,
                                    **self.client_kwargs)
        try:
            await admin.start()
            await admin.describe_cluster()
        finally:
            with contextlib.suppress(Exception):
                await admin.close()

    def _record(self, up: bool, error: str) -> None:
        if error:
            self.last_error = error
        if up == self.up:
            return
        now = self.clock()
        if up:
            log.warning("broker reachable again at %s after %.0f s", self.bootstrap, now - self.since)
        else:
            log.warning("broker unreachable at %s (%s): consumer lag is unknown and no partition is "
                        "read until it answers", self.bootstrap, error)
        self.up = up
        self.since = now
