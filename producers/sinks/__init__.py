"""Where encoded batches go: local trace files and/or a Kafka topic.

A sink receives every batch already encoded (the bytes are identical for both sinks,
so they are encoded once) and must never block or raise into the training loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from invariants.events import Batch


@dataclass
class SinkStats:
    """Delivery counters a sink reports in ``producer_stats`` meta events and summaries."""

    sent_batches: int = 0
    sent_events: int = 0
    dropped_batches: int = 0
    dropped_events: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "sent_batches": self.sent_batches,
            "sent_events": self.sent_events,
            "dropped_batches": self.dropped_batches,
            "dropped_events": self.dropped_events,
        }


class Sink(Protocol):
    name: str

    def write(self, batch: Batch, payload: bytes) -> None:
        """Take one encoded batch; never block on I/O that can stall, never raise."""

    def stats(self) -> SinkStats: ...

    def close(self, timeout_s: float) -> None:
        """Deliver what is pending within ``timeout_s``; count the rest as dropped."""

    def wait_delivered(self, timeout_s: float) -> bool:
        """Block until every batch written so far is delivered or written off, at most
        ``timeout_s``; True if nothing is pending any more."""


from .file import FileSink  # noqa: E402
from .kafka import KafkaSink, kafka_settings_from_env  # noqa: E402

__all__ = ["FileSink", "KafkaSink", "Sink", "SinkStats", "kafka_settings_from_env"]
