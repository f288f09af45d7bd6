"""Violation records on the wire and as one readable console line.

The violations topic carries JSON (UTF-8), keyed by run: it is read by people with
``kafka-console-consumer`` as much as by programs, and a violation is small.
"""

from __future__ import annotations

import json
import math
from typing import Any


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    return value


def encode_violation(record: dict[str, Any]) -> bytes:
    return json.dumps(_jsonable(record), sort_keys=True, default=str).encode()


def decode_violation(data: bytes) -> dict[str, Any]:
    return json.loads(data)


def violation_line(record: dict[str, Any]) -> str:
    """``VIOLATION run=r step=4 ranks=1 [Consistent] description (invariant id)``.

    Trend-monitor alerts read ``TREND run=r step=9 [Trend:loss_spike] ...``.
    """
    ranks = record.get("ranks") or []
    rank_text = ",".join(str(r) for r in ranks) if ranks else "-"
    description = str(record.get("description") or record.get("invariant") or "").strip()
    relation = str(record.get("relation"))
    if relation.startswith("Trend:"):
        return f"TREND run={record.get('run')} step={record.get('step')} [{relation}] {record.get('description')}"
    line = (
        f"VIOLATION run={record.get('run')} step={record.get('step')} ranks={rank_text} "
        f"[{record.get('relation')}] {description}"
    )
    hint = record.get("hint")
    if hint:
        line += f" — hint: {hint}"
    return f"{line} (invariant {record.get('invariant')})"
