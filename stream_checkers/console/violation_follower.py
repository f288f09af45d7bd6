"""Violations of one run, printed as they land on the violations topic.

A thread, not the checker's stdout: with ``--bootstrap`` the checkers that judge the
run may be elsewhere, and the topic is the one place every violation reaches.  Ids
are remembered so a violation repeated after a checker restart is printed once.
"""

from __future__ import annotations

import threading
from typing import Any, TextIO

from ..config import KafkaSecurity
from ..report import decode_violation
from .supervisor import TopicReader
from .violation_fold import RepeatFolder


class ViolationFollower(threading.Thread):
    """Prints this run's violations as they land on the violations topic."""

    def __init__(self, bootstrap: str, topic: str, run_id: str, out: TextIO, *, fold_repeats: bool = True) -> None:
        super().__init__(name="trainwatch-violations", daemon=True)
        # The same TRAINWATCH_KAFKA_* settings the checker and the producers use.
        self.reader = TopicReader(bootstrap, topic, KafkaSecurity.from_env().kafka_python_kwargs())
        self.run_id = run_id
        self.out = out
        self.seen: dict[str, dict[str, Any]] = {}
        self.folder = RepeatFolder(fold=fold_repeats)
        self.stopping = threading.Event()
        self.caught_up = threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                found = [v for v in (self._decode(r.value) for r in self.reader.poll(0.2)) if v is not None]
                by_step: dict[Any, list[dict[str, Any]]] = {}
                for violation in sorted(found, key=lambda v: (v.get("step") or 0, str(v.get("relation")))):
                    by_step.setdefault(violation.get("step"), []).append(violation)
                for violations in by_step.values():
                    self._handle(violations)
                if self.reader.caught_up():
                    self.caught_up.set()
                else:
                    self.caught_up.clear()
        except Exception as exc:  # reported in the summary; the run itself goes on
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.reader.close()

    @staticmethod
    def _decode(value: bytes) -> dict[str, Any] | None:
        try:
            violation = decode_violation(value)
        except ValueError:
            return None
        return violation if isinstance(violation, dict) else None

    def _handle(self, violations: list[dict[str, Any]]) -> None:
        """Print one step's newly seen violations of this run."""
        fresh = []
        for violation in violations:
            vid = str(violation.get("id"))
            if violation.get("run") == self.run_id and vid not in self.seen:
                self.seen[vid] = violation
                fresh.append(violation)
        for line in self.folder.lines_for_step(fresh):
            print(line, file=self.out, flush=True)

    def settle(self, timeout_s: float) -> None:
        """Wait until the follower has read everything published so far."""
        self.caught_up.clear()
        self.caught_up.wait(timeout_s)

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=10)
