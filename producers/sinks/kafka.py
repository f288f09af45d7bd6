"""Kafka sink: a background sender fed by a bounded queue.

The training thread only does ``queue.put_nowait``; everything that can wait on the
network (connecting, metadata, sends, retries) happens in one daemon thread.  When the
broker is slow or gone the queue fills and batches are *dropped and counted* instead
of stalling training; the sender keeps reconnecting with backoff and resumes when the
broker returns.  Each message is one batch: key ``<run>:<step>`` (kafka-python's
default murmur2 partitioner then puts every rank's events of one step on one
partition), value the encoded batch.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import logging
import os
import queue
import socket
import ssl
import threading
import time
import weakref
from typing import Any, Callable, Mapping

from invariants.events import Batch, batch_key

from . import SinkStats

_STOP = object()
_ENV_SECURITY = {
    "TRAINWATCH_KAFKA_SECURITY_PROTOCOL": "security_protocol",
    "TRAINWATCH_KAFKA_SASL_MECHANISM": "sasl_mechanism",
    "TRAINWATCH_KAFKA_SASL_USERNAME": "sasl_plain_username",
    "TRAINWATCH_KAFKA_SASL_PASSWORD": "sasl_plain_password",
    "TRAINWATCH_KAFKA_SSL_CAFILE": "ssl_cafile",
}


def kafka_settings_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """SASL/SSL producer settings from ``TRAINWATCH_KAFKA_*`` (secrets stay out of argv)."""
    environ = os.environ if environ is None else environ
    return {option: environ[var] for var, option in _ENV_SECURITY.items() if environ.get(var)}


def _finish_client_import(sink_ref: "weakref.ref[KafkaSink]") -> None:
    """Before a fork: let a sender thread that is importing kafka-python finish.

    The sender imports the client lazily, off the training thread.  A fork in the
    middle of that import (a DataLoader starting its workers) leaves the child with a
    half-initialised ``kafka`` module that can never be imported again there, and the
    worker's report is lost.  Importing here waits on the module's import lock until
    the sender's import is complete (and is a dictionary lookup once it is).
    """
    sink = sink_ref()
    if sink is not None and sink._thread is not None:
        importlib.import_module("kafka")


class KafkaSink:
    """Ships batches to ``topic`` on ``bootstrap`` without ever blocking the caller."""

    name = "kafka"

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        settings: Mapping[str, Any] | None = None,
        queue_max: int = 2048,
        on_client_created: Callable[[], None] | None = None,
        backoff_s: tuple[float, float] = (0.2, 5.0),
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self._settings = dict(settings or {})
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_max)
        self._stats = SinkStats()
        self._lock = threading.Lock()
        self._settled_cv = threading.Condition(self._lock)
        self._accepted = 0  # batches queued by `write`
        self._finished = 0  # of those, delivered or written off
        self._in_flight = 0  # handed to the client, no delivery report yet
        self._thread: threading.Thread | None = None
        self._on_client_created = on_client_created
        self._backoff_min, self._backoff_max = backoff_s
        self.last_error: str | None = None
        self._closed = False
        self._close_deadline = float("inf")  # set by `close`: the sender's shutdown ends by then
        os.register_at_fork(before=functools.partial(_finish_client_import, weakref.ref(self)))

    # -- training-thread side -------------------------------------------------------
    def write(self, batch: Batch, payload: bytes) -> None:
        events = len(batch["events"])
        if self._closed:
            self._count_drop(events)
            return
        if self._thread is None:
            self._start()
        try:
            self._queue.put_nowait((batch_key(batch["run"], batch["step"]), payload, events))
        except queue.Full:
            self._count_drop(events)
            return
        with self._lock:
            self._accepted += 1

    def wait_delivered(self, timeout_s: float) -> bool:
        with self._settled_cv:
            target = self._accepted
            return self._settled_cv.wait_for(lambda: self._finished >= target or self._closed,
                                             max(timeout_s, 0.0))

    def stats(self) -> SinkStats:
        with self._lock:
            return SinkStats(**self._stats.as_dict())

    def close(self, timeout_s: float = 5.0) -> None:
        """Deliver what is queued within ``timeout_s``; whatever is left counts as dropped."""
        if self._closed:
            return
        self._closed = True
        if self._thread is None:
            return
        deadline = time.monotonic() + max(timeout_s, 0.0)
        self._close_deadline = deadline
        self._put_stop(deadline)
        self._thread.join(max(deadline - time.monotonic(), 0.0))
        # Anything still queued or in flight after the deadline is lost.
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                self._count_drop(item[2])
        with self._lock:
            if self._thread.is_alive() or self._in_flight:
                self._stats.dropped_events += self._in_flight_events
                self._stats.dropped_batches += self._in_flight
                self._in_flight = 0
                self._in_flight_events = 0
            self._settled_cv.notify_all()  # `_closed` releases anyone waiting for delivery

    def forget_after_fork(self) -> None:
        """In a forked child the sender thread does not exist: start over, quietly."""
        self._queue = queue.Queue(maxsize=self._queue.maxsize)
        self._lock = threading.Lock()
        self._settled_cv = threading.Condition(self._lock)
        self._accepted = self._finished = 0
        self._stats = SinkStats()
        self._thread = None
        self._in_flight = 0
        self._in_flight_events = 0
        self._closed = False

    # -- sender-thread side ---------------------------------------------------------
    _in_flight_events = 0

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="trainwatch-kafka-sender", daemon=True)
        self._thread.start()

    def _put_stop(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                self._queue.put(_STOP, timeout=0.05)
                return
            except queue.Full:
                continue

    def _count_drop(self, events: int, batches: int = 1) -> None:
        with self._lock:
            self._stats.dropped_batches += batches
            self._stats.dropped_events += events

    def _probe(self) -> None:
        """One TCP connect per bootstrap server before building a client, and a TLS
        handshake when the settings ask for TLS.

        A kafka-python client aimed at a dead broker spins through short reconnect
        polls; every wake-up competes for the GIL and slows the training thread
        (measured: a torch import took 2.3x longer).  A refused connect is one syscall.
        kafka-python 3.0 also awaits a TLS handshake without a deadline, so a TLS client
        aimed at a plaintext listener, or one that distrusts the broker's certificate,
        would hold the sender thread with no reason recorded; the handshake here has a
        deadline and its failure becomes the sink's ``last_error``.
        """
        tls = None
        if str(self._settings.get("security_protocol", "")).upper() in ("SSL", "SASL_SSL"):
            tls = ssl.create_default_context(cafile=self._settings.get("ssl_cafile"))
        last: Exception | None = None
        tls_failure: str | None = None
        for server in self.bootstrap.split(","):
            host, _, port = server.strip().rpartition(":")
            host = host.strip("[]")
            try:
                sock = socket.create_connection((host, int(port)), timeout=2.0)
            except (OSError, ValueError) as exc:
                last = exc
                continue
            with sock:
                if tls is None:
                    return
                try:
                    tls.wrap_socket(sock, server_hostname=host).close()
                    return
                except ssl.SSLError as exc:
                    tls_failure = f"TLS handshake with {host}:{port} failed: {exc.reason or exc}"
                except OSError as exc:  # a plaintext listener never answers the hello
                    tls_failure = f"{host}:{port} did not answer the TLS handshake ({exc or 'timed out'})"
        if tls_failure is not None:
            raise ConnectionError(tls_failure)
        raise ConnectionError(f"no bootstrap server of {self.bootstrap} accepts connections ({last})")

    def _connect(self) -> Any:
        self._probe()
        from kafka import KafkaProducer

        logging.getLogger("kafka").setLevel(logging.CRITICAL)  # we report failures ourselves
        producer = KafkaProducer(
            bootstrap_servers=self.bootstrap,
            acks=1,
            linger_ms=5,
            max_block_ms=2000,
            request_timeout_ms=3000,
            delivery_timeout_ms=6000,
            reconnect_backoff_ms=100,
            reconnect_backoff_max_ms=1000,
            retries=3,
            client_id=f"trainwatch-producer-{os.getpid()}",
            **self._settings,
        )
        # The client's own exit hook waits on a dead broker and prints a traceback from
        # atexit; `_shutdown` closes it within the sink's deadline instead.
        cleanup = getattr(producer, "_cleanup", None)
        if cleanup is not None:
            atexit.unregister(cleanup)
        if self._on_client_created is not None:
            self._on_client_created()
        return producer

    def _run(self) -> None:
        producer = None
        backoff = self._backoff_min
        next_attempt = 0.0
        while True:
            item = self._queue.get()
            if item is _STOP:
                break
            key, payload, events = item
            with self._lock:  # from here on the batch is ours to deliver or write off
                self._in_flight += 1
                self._in_flight_events += events
            if producer is None and time.monotonic() >= next_attempt:
                try:
                    producer = self._connect()
                    backoff = self._backoff_min
                except Exception as exc:  # NoBrokersAvailable, auth errors, DNS...
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    next_attempt = time.monotonic() + backoff
                    backoff = min(backoff * 2, self._backoff_max)
            if producer is None:
                self._settle(events, delivered=False)
                continue
            self._send(producer, key, payload, events)
        if producer is not None:
            self._shutdown(producer)

    def _send(self, producer: Any, key: bytes, payload: bytes, events: int) -> None:
        try:
            future = producer.send(self.topic, key=key, value=payload)
        except Exception as exc:  # buffer full / metadata timeout while the broker is down
            self.last_error = f"{type(exc).__name__}: {exc}"
            self._settle(events, delivered=False)
            return
        future.add_callback(lambda _meta: self._settle(events, delivered=True))
        future.add_errback(lambda _exc: self._settle(events, delivered=False))

    def _settle(self, events: int, delivered: bool) -> None:
        with self._lock:
            if self._in_flight == 0:
                return  # already written off at close
            self._in_flight -= 1
            self._in_flight_events -= events
            self._finished += 1
            self._settled_cv.notify_all()
            if delivered:
                self._stats.sent_batches += 1
                self._stats.sent_events += events
            else:
                self._stats.dropped_batches += 1
                self._stats.dropped_events += events

    def _shutdown(self, producer: Any) -> None:
        """Flush and close within what is left of `close`'s deadline; what is not
        delivered by then is counted as dropped by `close`, never waited for."""
        try:
            producer.flush(timeout=max(self._close_deadline - time.monotonic(), 0.0))
        except Exception as exc:
            self.last_error = f"the broker did not acknowledge the last batches before the flush timeout ({type(exc).__name__})"
        try:
            producer.close(timeout=max(min(self._close_deadline - time.monotonic(), 0.5), 0.0), null_logger=True)
        except Exception:
            pass
