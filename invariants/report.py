"""Check reports for people: console text and JSON document (`report_html` draws the page).

Every form leads with the *first* violation — the earliest step, where the root cause
most likely is — spelled out (step, ranks, stage, the invariant in plain words, the
offending evidence, a hint), then groups the rest by invariant so that one broken
rule firing on every later step reads as one line, not a thousand.  Pure functions:
they return strings/dicts and the caller writes them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable

from .coverage import Coverage
from .coverage_text import describe_run, nothing_checked_line, ok_line
from .model import Violation
from .precondition import describe_precondition
from .step_summary import StepSummary


@dataclass
class CheckSummary:
    invariants: int = 0
    runs: list[str] = field(default_factory=list)
    batches: int = 0
    events: int = 0
    windows: int = 0
    late_batches: int = 0
    partial_windows: int = 0
    truncated: list[tuple[str, int]] = field(default_factory=list)
    source: str = ""
    coverage: Coverage = field(default_factory=Coverage)
    rules_by_relation: dict[str, int] = field(default_factory=dict)
    steps: list[StepSummary] = field(default_factory=list)  # per-step signals, when the caller folded them


def group_violations(violations: list[Violation]) -> list[dict[str, Any]]:
    groups: dict[str, dict[str, Any]] = {}
    for v in violations:
        g = groups.get(v.invariant)
        if g is None:
            g = groups[v.invariant] = {
                "invariant": v.invariant, "relation": v.relation, "description": v.description, "hint": v.hint,
                "count": 0, "first_step": v.step, "last_step": v.step, "ranks": set(), "runs": set(), "first": v,
            }
        g["count"] += 1
        g["first_step"] = min(g["first_step"], v.step)
        g["last_step"] = max(g["last_step"], v.step)
        g["ranks"].update(v.ranks)
        g["runs"].add(v.run)
    return sorted(groups.values(), key=lambda g: (g["first_step"], g["invariant"]))


def short_json(value: Any, limit: int = 300) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def render_text(violations: list[Violation], summary: CheckSummary, preconditions: dict[str, Any] | None = None) -> str:
    lines: list[str] = []
    for path, offset in summary.truncated:
        lines.append(f"note: {path}: torn last record at byte offset {offset} was skipped (writer killed?)")
    checked = (f"checked {summary.windows} step windows ({summary.events} events) of run(s) "
               f"{', '.join(summary.runs) or '-'} against {summary.invariants} invariants")
    if not violations:
        # a run without a training iteration gets no "OK": the caller says so and exits 2
        trained = summary.coverage.trained()
        if trained:
            lines.append(ok_line(trained))
            lines.append(f"  {checked}")
        return "\n".join(lines) + "\n" if lines else ""
    ordered = sorted(violations, key=Violation.sort_key)
    first = ordered[0]
    lines.append(f"VIOLATION at step {first.step} (run {first.run}, ranks {first.ranks or '-'}, stage {first.stage or '-'})")
    lines.append(f"  invariant: {first.description}  [{first.relation} {first.invariant}]")
    if preconditions and preconditions.get(first.invariant) is not None:
        lines.append(f"  applies when: {describe_precondition(preconditions[first.invariant])}")
    lines.append(f"  evidence:  {short_json(first.evidence)}")
    if first.hint:
        lines.append(f"  likely cause: {first.hint}")
    groups = group_violations(ordered)
    lines.append("")
    lines.append(f"{len(ordered)} violation(s) of {len(groups)} invariant(s); {checked}:")
    for g in groups:
        steps = f"step {g['first_step']}" if g["first_step"] == g["last_step"] else f"steps {g['first_step']}..{g['last_step']}"
        lines.append(f"  - {g['description']}: {g['count']}x, {steps}, ranks {sorted(g['ranks'])} [{g['relation']} {g['invariant']}]")
    lines.extend(f"coverage: {describe_run(run)}" for run in summary.coverage.runs.values())
    return "\n".join(lines) + "\n"


def untrained_lines(violations: list[Violation], summary: CheckSummary) -> list[str]:
    """One line per run that recorded no training iteration (the verdict is then not "OK")."""
    per_run: dict[str, int] = {}
    for v in violations:
        per_run[v.run] = per_run.get(v.run, 0) + 1
    return [nothing_checked_line(run.run, run.optimizer_steps, bool(run.setup_ranks), per_run.get(run.run, 0))
            for run in summary.coverage.untrained()]


def render_json(violations: list[Violation], summary: CheckSummary) -> dict[str, Any]:
    ordered = sorted(violations, key=Violation.sort_key)
    groups = group_violations(ordered)
    return {
        "summary": {
            "violations": len(ordered),
            "invariants_violated": len(groups),
            "first_violation_step": ordered[0].step if ordered else None,
            "invariants_checked": summary.invariants,
            "runs": summary.runs,
            "windows": summary.windows,
            "batches": summary.batches,
            "events": summary.events,
            "late_batches": summary.late_batches,
            "partial_windows": summary.partial_windows,
            "truncated": [{"file": p, "offset": o} for p, o in summary.truncated],
            "coverage": summary.coverage.to_dict(len(ordered)),
            "by_invariant": [
                {"invariant": g["invariant"], "relation": g["relation"], "description": g["description"],
                 "occurrences": g["count"], "first_step": g["first_step"], "last_step": g["last_step"],
                 "ranks": sorted(g["ranks"])}
                for g in groups
            ],
        },
        "violations": [v.to_dict() for v in ordered],
    }


def preconditions_by_id(invariants: Iterable[Any]) -> dict[str, Any]:
    return {inv.id: inv.precondition for inv in invariants}


def rules_by_relation(invariants: Iterable[Any]) -> dict[str, int]:
    """How many rules of each relation a set holds: what a clean verdict vouches for."""
    counts: dict[str, int] = {}
    for inv in invariants:
        counts[inv.relation] = counts.get(inv.relation, 0) + 1
    return counts
