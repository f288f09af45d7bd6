"""Dead-letter records: enough to find and triage a rejected message, not a copy of it.

Rejected input may be anything a producer sent, secrets included (a command line, a
tensor of user data), and the dead-letter topic is read by operators who need only
why a message was rejected and where it sits.  So a record keeps a short prefix of
the raw value (enough to recognise garbage or a wrong format at a glance), its size
and a SHA-256 digest to match it against the original, which stays in the source
topic (topic, partition and offset are in the record) for as long as its retention.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Any

#: Dead-letter records keep at most this many bytes of the original message.
DEAD_LETTER_PREFIX_BYTES = 256
#: Exception messages may quote input; they are cut to this many characters.
DEAD_LETTER_ERROR_CHARS = 500


@dataclass(frozen=True)
class DeadLetterRecord:
    reason: str
    error: str
    topic: str
    partition: int
    offset: int
    timestamp: float | None
    key: bytes | None
    value: bytes  # the first DEAD_LETTER_PREFIX_BYTES bytes
    value_size: int
    value_sha256: str
    value_truncated: bool
    checker: str
    at: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def dead_letter_record(message: Any, reason: str, error: str, *, checker: str, at: float) -> DeadLetterRecord:
    """The record for one rejected Kafka message (anything with topic/partition/offset/...)."""
    value = message.value or b""
    return DeadLetterRecord(
        reason=reason,
        error=error[:DEAD_LETTER_ERROR_CHARS],
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
        timestamp=message.timestamp,
        key=message.key,
        value=value[:DEAD_LETTER_PREFIX_BYTES],
        value_size=len(value),
        value_sha256=hashlib.sha256(value).hexdigest(),
        value_truncated=len(value) > DEAD_LETTER_PREFIX_BYTES,
        checker=checker,
        at=at,
    )
