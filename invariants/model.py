"""Invariants and violations as plain data, with ids derived from their content.

An invariant's id is a hash of the canonical JSON of ``relation + params +
precondition``: two inference runs over the same traces write byte-identical files,
and the same rule learned from different traces gets the same id, so sets can be
merged and diffed.  A violation's id is derived from invariant, run and step, so a
checker that replays a step after a restart produces the same id and a consumer can
drop the duplicate.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any


def canonical_json(value: Any) -> str:
    """Key-sorted, whitespace-free JSON: the byte form that ids are hashed from."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def content_id(prefix: str, value: Any, length: int = 16) -> str:
    digest = hashlib.sha256(canonical_json(value).encode()).hexdigest()
    return f"{prefix}-{digest[:length]}"


@dataclass
class Invariant:
    """``relation(params) if precondition``; ``precondition`` is the JSON form (None = always)."""

    relation: str
    params: dict[str, Any]
    precondition: dict[str, Any] | None = None
    description: str = ""
    apis: list[str] = field(default_factory=list)
    positive: int = 0
    negative: int = 0
    id: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            self.id = self.compute_id()

    def compute_id(self) -> str:
        return content_id(
            "inv",
            {"relation": self.relation, "params": self.params, "precondition": self.precondition},
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "relation": self.relation,
            "params": self.params,
            "precondition": self.precondition,
            "description": self.description,
            "apis": sorted(self.apis),
            "examples": {"positive": self.positive, "negative": self.negative},
        }


@dataclass
class Violation:
    """One invariant broken in one step window (all offending sites of that step grouped)."""

    invariant: str
    relation: str
    description: str
    run: str
    step: int
    ranks: list[int]
    stage: str
    evidence: dict[str, Any]
    hint: str
    id: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            self.id = content_id("vio", [self.invariant, self.run, self.step])

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "invariant": self.invariant,
            "relation": self.relation,
            "description": self.description,
            "run": self.run,
            "step": self.step,
            "ranks": list(self.ranks),
            "stage": self.stage,
            "evidence": self.evidence,
            "hint": self.hint,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Violation":
        return cls(
            invariant=str(data["invariant"]),
            relation=str(data["relation"]),
            description=str(data.get("description", "")),
            run=str(data["run"]),
            step=int(data["step"]),
            ranks=[int(r) for r in data.get("ranks", [])],
            stage=str(data.get("stage", "")),
            evidence=dict(data.get("evidence") or {}),
            hint=str(data.get("hint", "")),
            id=str(data.get("id", "")),
        )

    def sort_key(self) -> tuple[Any, ...]:
        """Earliest step first; within a step, the violation naming the fewest ranks
        localises the fault best, so it leads the report."""
        return (self.run, self.step, len(self.ranks) if self.ranks else 1 << 20, self.invariant)
