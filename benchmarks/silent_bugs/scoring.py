"""Pure scoring of ``trainwatch check`` reports: did a run's violations catch its bug?

Kept free of I/O so that the benchmark and the test suite judge detections the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

#: A detection counts when the first violation at or after the onset comes within this
#: many steps of it (the target: "within one step of onset").
DETECTION_WINDOW = 1


@dataclass
class Detection:
    detected: bool
    first_step: int | None  # first violation step at or after the onset
    delay: int | None  # first_step - onset
    early_violations: int  # violations before the onset (false alarms in the healthy prefix)
    relations: list[str] = field(default_factory=list)  # of the violations at first_step
    invariants: list[str] = field(default_factory=list)  # descriptions, first_step's violations
    top: dict[str, Any] | None = None
    names_root_cause: bool = False


def _text(violation: dict[str, Any]) -> str:
    return " ".join(str(violation.get(k, "")) for k in ("description", "evidence", "hint", "invariant")).lower()


def names_root_cause(violation: dict[str, Any] | None, root_cause: Iterable[str]) -> bool:
    if violation is None:
        return False
    text = _text(violation)
    return any(name.lower() in text for name in root_cause)


def rank_violations(violations: Sequence[dict[str, Any]], root_cause: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Order as a user reads them: earliest step first; the report's own order within a step."""
    return sorted(violations, key=lambda v: v.get("step", 0))


def score(violations: Sequence[dict[str, Any]], onset: int, root_cause: Sequence[str],
          twin_violations: Sequence[dict[str, Any]] = ()) -> Detection:
    """Judge one buggy run. An invariant that the healthy twin violates too says nothing
    about the bug (it fires on the shared, healthy part of the program), so its
    violations do not count as a detection."""
    shared = {v.get("invariant") for v in twin_violations}
    violations = [v for v in violations if v.get("invariant") not in shared]
    early = [v for v in violations if v.get("step", 0) < onset]
    late = rank_violations([v for v in violations if v.get("step", 0) >= onset])
    if not late:
        return Detection(False, None, None, len(early))
    first_step = late[0]["step"]
    at_first = [v for v in late if v["step"] == first_step]
    top = at_first[0]
    relations = sorted({v.get("relation", "?") for v in at_first})
    descriptions = sorted({v.get("description", v.get("invariant", "?")) for v in at_first})
    delay = first_step - onset
    return Detection(
        detected=delay <= DETECTION_WINDOW,
        first_step=first_step, delay=delay, early_violations=len(early),
        relations=relations, invariants=descriptions, top=top,
        names_root_cause=any(names_root_cause(v, root_cause) for v in at_first[:3]),
    )


@dataclass
class FalsePositives:
    runs: int = 0
    runs_with_violation: int = 0
    invariants_checked: int = 0
    invariants_violated: int = 0
    offenders: dict[str, list[str]] = field(default_factory=dict)  # run label -> violated descriptions

    def add(self, label: str, checked: int, violations: Sequence[dict[str, Any]]) -> None:
        violated = sorted({v.get("description", v.get("invariant", "?")) for v in violations})
        self.runs += 1
        self.invariants_checked += checked
        self.invariants_violated += len(violated)
        if violated:
            self.runs_with_violation += 1
            self.offenders[label] = violated

    @property
    def clean_fraction(self) -> float:
        return 1.0 - self.runs_with_violation / self.runs if self.runs else 1.0

    @property
    def violated_fraction(self) -> float:
        return self.invariants_violated / self.invariants_checked if self.invariants_checked else 0.0
