"""Offset-commit caps combined for Faust's commit path (see `transport.HighwaterTransport`).

Faust has one hook for what it commits, which `transport` overrides; the worker has two
reasons to hold a commit back (records lost between fetcher and agent, `InputOrder`, and
windows not written to their table yet, `windows.pending`), so they are combined here.
"""

from __future__ import annotations

from typing import Any

from faust.types import TP


class CommitGates:
    """Several commit caps applied together: the lowest limit wins, None (nothing yet) too."""

    def __init__(self, *gates: Any) -> None:
        self.gates = gates

    def commit_limit(self, tp: TP, offset: int) -> int | None:
        limit: int | None = offset
        for gate in self.gates:
            capped = gate.commit_limit(tp, offset)
            if capped is None:
                return None
            limit = capped if limit is None else min(limit, capped)
        return limit
