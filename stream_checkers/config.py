"""Checker settings: one frozen value built from flags and ``TRAINWATCH_*`` variables.

Everything the worker needs to know is in `CheckerConfig`, so that the Faust app, the
topic administration and the metrics exporter take an explicit value instead of
reading the environment behind the caller's back.  Environment names match the
producer's (``TRAINWATCH_KAFKA_SECURITY_PROTOCOL`` etc.), so one set of variables
configures a whole deployment.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field
from typing import Any, Mapping

from invariants.events import (
    DEAD_LETTER_TOPIC,
    DEFAULT_TOPIC_PREFIX,
    EVENTS_TOPIC,
    STEP_SUMMARIES_TOPIC,
    VIOLATIONS_TOPIC,
)

DEFAULT_PARTITIONS = 4
#: How long a step window waits for a rank that has not reported it.  Windows close as
#: soon as every rank reported, so this only delays the verdict on a rank that is really
#: gone; set below the worst delivery skew between ranks (a loaded host, a GC pause, a
#: slow link to the broker) it pages about healthy ranks instead.
DEFAULT_GRACE_SECONDS = 10.0
DEFAULT_METRICS_PORT = 9464
DEFAULT_APP_ID = "trainwatch-checker"


@dataclass(frozen=True)
class KafkaSecurity:
    """SASL/SSL client settings shared by Faust, kafka-python admin and consumers."""

    protocol: str = "PLAINTEXT"  # PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
    sasl_mechanism: str | None = None  # PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ssl_cafile: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "KafkaSecurity":
        env = os.environ if env is None else env
        return cls(
            protocol=env.get("TRAINWATCH_KAFKA_SECURITY_PROTOCOL", "PLAINTEXT").upper(),
            sasl_mechanism=env.get("TRAINWATCH_KAFKA_SASL_MECHANISM") or None,
            username=env.get("TRAINWATCH_KAFKA_SASL_USERNAME") or None,
            password=env.get("TRAINWATCH_KAFKA_SASL_PASSWORD") or None,
            ssl_cafile=env.get("TRAINWATCH_KAFKA_SSL_CAFILE") or None,
        )

    def validate(self) -> None:
        allowed = {"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"}
        if self.protocol not in allowed:
            raise ValueError(f"security protocol {self.protocol!r} is not one of {sorted(allowed)}")
        if self.protocol.startswith("SASL") and not (self.username and self.password):
            raise ValueError(f"{self.protocol} needs a SASL username and password")
        if self.ssl_cafile and self.protocol.endswith("SSL"):
            # Loaded here so that a missing or non-PEM file is a usage error at start,
            # not a string of failed handshakes ending in "unable to bootstrap".
            try:
                ssl.create_default_context(cafile=self.ssl_cafile)
            except (OSError, ssl.SSLError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                raise ValueError(f"TRAINWATCH_KAFKA_SSL_CAFILE={self.ssl_cafile} cannot be loaded: {reason}") from None

    def kafka_python_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for kafka-python clients (admin, consumer, producer)."""
        kwargs: dict[str, Any] = {"security_protocol": self.protocol}
        if self.protocol.startswith("SASL"):
            kwargs.update(
                sasl_mechanism=self.sasl_mechanism or "PLAIN",
                sasl_plain_username=self.username,
                sasl_plain_password=self.password,
            )
        if self.ssl_cafile:
            kwargs["ssl_cafile"] = self.ssl_cafile
        return kwargs

    def ssl_context(self) -> ssl.SSLContext | None:
        if self.protocol not in ("SSL", "SASL_SSL"):
            return None
        return ssl.create_default_context(cafile=self.ssl_cafile)


@dataclass(frozen=True)
class TopicNames:
    """Topic names of the wire contract (docs/design.md, "Topics") under one prefix, plus
    the checker's internal tick topic."""

    prefix: str = DEFAULT_TOPIC_PREFIX

    @property
    def events(self) -> str:
        return f"{self.prefix}{EVENTS_TOPIC}"

    @property
    def violations(self) -> str:
        return f"{self.prefix}{VIOLATIONS_TOPIC}"

    @property
    def step_summaries(self) -> str:
        return f"{self.prefix}{STEP_SUMMARIES_TOPIC}"

    @property
    def dead_letter(self) -> str:
        return f"{self.prefix}{DEAD_LETTER_TOPIC}"

    @property
    def window_ticks(self) -> str:
        """Internal: close/evict requests the worker's timer routes to a window's partition."""
        return f"{self.prefix}window-ticks"

    def partitioned(self) -> tuple[str, ...]:
        """Topics that must share the tables' partition count (Faust co-partitioning)."""
        return (self.events, self.step_summaries, self.window_ticks)

    def all(self) -> tuple[str, ...]:
        return (self.events, self.violations, self.step_summaries, self.dead_letter, self.window_ticks)


@dataclass(frozen=True)
class CheckerConfig:
    bootstrap: str
    invariants_path: str | None = None
    metrics_host: str = "127.0.0.1"
    metrics_port: int = DEFAULT_METRICS_PORT
    partitions: int = DEFAULT_PARTITIONS
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    topic_prefix: str = DEFAULT_TOPIC_PREFIX
    app_id: str = DEFAULT_APP_ID
    data_dir: str = ".trainwatch-checker"
    security: KafkaSecurity = field(default_factory=KafkaSecurity)
    #: How long a closed window's marker (emitted violation ids, seen batches) is kept to
    #: recognise late and replayed batches before it is evicted.
    closed_retention_seconds: float = 120.0
    tick_interval_seconds: float = 0.25
    max_batch_bytes: int = 16 * 1024 * 1024
    #: Broker session timing: a few seconds so a worker joins and takes over fast.
    session_timeout_seconds: float = 6.0
    log_level: str = "WARNING"
    connect_timeout_seconds: float = 30.0
    #: Produce every record (changelog writes included) in its own record batch.
    single_record_batches: bool = True

    @property
    def topics(self) -> TopicNames:
        return TopicNames(self.topic_prefix)

    @property
    def bootstrap_servers(self) -> list[str]:
        return [part.strip() for part in self.bootstrap.split(",") if part.strip()]

    def validate(self) -> None:
        if not self.bootstrap_servers:
            raise ValueError("no bootstrap server given (--bootstrap HOST:PORT or TRAINWATCH_BOOTSTRAP)")
        for server in self.bootstrap_servers:
            host, _, port = server.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"bootstrap server {server!r} is not HOST:PORT")
        if self.partitions < 1:
            raise ValueError("--partitions must be at least 1")
        if self.grace_seconds <= 0:
            raise ValueError("--grace-seconds must be positive")
        if not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"--metrics-port {self.metrics_port} is not a port number")
        self.security.validate()
