"""Check reports for people: console text, JSON document, self-contained HTML.

Every form leads with the *first* violation — the earliest step, where the root cause
most likely is — spelled out (step, ranks, stage, the invariant in plain words, the
offending evidence, a hint), then groups the rest by invariant so that one broken
rule firing on every later step reads as one line, not a thousand.  Pure functions:
they return strings/dicts and the caller writes them.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from typing import Any, Iterable

from .coverage import Coverage
from .coverage_text import describe_run, nothing_checked_line, ok_line
from .model import Violation
from .precondition import describe_precondition


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


def _group(violations: list[Violation]) -> list[dict[str, Any]]:
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


def _short(value: Any, limit: int = 300) -> str:
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
    lines.append(f"  evidence:  {_short(first.evidence)}")
    if first.hint:
        lines.append(f"  likely cause: {first.hint}")
    groups = _group(ordered)
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
    groups = _group(ordered)
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


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem;color:#1d232a;max-width:70rem}
h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:2rem}
.ok{background:#e8f6ec;border-left:4px solid #2e9e50;padding:.8rem 1rem}
.nothing{background:#fff6e0;border-left:4px solid #d08a00;padding:.8rem 1rem}
.first{background:#fdecea;border-left:4px solid #c62828;padding:.8rem 1rem}
.first dt{font-weight:600;margin-top:.4rem}.first dd{margin-left:1rem}
table{border-collapse:collapse;width:100%;font-size:.9rem}th,td{border-bottom:1px solid #ddd;padding:.35rem .5rem;text-align:left;vertical-align:top}
th{background:#f4f5f7}code,pre{font-family:ui-monospace,Menlo,monospace;font-size:.85rem}
pre{white-space:pre-wrap;word-break:break-all;margin:0}.muted{color:#66707a}.badge{background:#eef;padding:0 .4rem;border-radius:.3rem}
"""


def render_html(violations: list[Violation], summary: CheckSummary, preconditions: dict[str, Any] | None = None) -> str:
    esc = html.escape
    ordered = sorted(violations, key=Violation.sort_key)
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>trainwatch check report</title>",
        f"<style>{_CSS}</style></head><body><h1>trainwatch check report</h1>",
        f"<p class='muted'>{esc(summary.source)} &middot; runs: {esc(', '.join(summary.runs) or '-')} &middot; "
        f"{summary.windows} step windows, {summary.events} events, {summary.invariants} invariants checked</p>",
    ]
    for path, offset in summary.truncated:
        parts.append(f"<p class='muted'>Torn last record skipped: {esc(path)} at byte offset {offset}.</p>")
    parts.append("<h2>Coverage</h2><ul class='coverage'>"
                 + "".join(f"<li>{esc(describe_run(run))}</li>" for run in summary.coverage.runs.values()) + "</ul>")
    untrained = untrained_lines(ordered, summary)
    if not ordered:
        if untrained:
            parts.append("".join(f"<p class='nothing'>{esc(line)}</p>" for line in untrained) + "</body></html>")
        else:
            parts.append("<p class='ok'>No violation: every invariant held at every step checked.</p></body></html>")
        return "".join(parts)
    first = ordered[0]
    applies = ""
    if preconditions and preconditions.get(first.invariant) is not None:
        applies = f"<dt>Applies when</dt><dd>{esc(describe_precondition(preconditions[first.invariant]))}</dd>"
    parts.append(
        "<h2>First violation</h2><dl class='first'>"
        f"<dt>Where</dt><dd>step <b>{first.step}</b> of run <code>{esc(first.run)}</code>, ranks "
        f"{esc(str(first.ranks))}, stage <span class='badge'>{esc(first.stage or '-')}</span></dd>"
        f"<dt>What should have held</dt><dd>{esc(first.description)}</dd>{applies}"
        f"<dt>What was seen</dt><dd><pre>{esc(json.dumps(first.evidence, indent=1, sort_keys=True, default=str))}</pre></dd>"
        f"<dt>Likely cause</dt><dd>{esc(first.hint or '-')}</dd>"
        f"<dt>Rule</dt><dd><code>{esc(first.relation)}</code> <code>{esc(first.invariant)}</code></dd></dl>"
    )
    parts.append("<h2>All violated invariants</h2><table><tr><th>Invariant</th><th>Occurrences</th><th>Steps</th>"
                 "<th>Ranks</th><th>Likely cause</th></tr>")
    for g in _group(ordered):
        parts.append(
            f"<tr><td>{esc(g['description'])}<br><span class='muted'>{esc(g['relation'])} {esc(g['invariant'])}</span></td>"
            f"<td>{g['count']}</td><td>{g['first_step']}&ndash;{g['last_step']}</td>"
            f"<td>{esc(str(sorted(g['ranks'])))}</td><td>{esc(g['hint'])}</td></tr>"
        )
    parts.append("</table><h2>Every violation</h2><table><tr><th>Step</th><th>Run</th><th>Ranks</th><th>Stage</th>"
                 "<th>Invariant</th><th>Evidence</th></tr>")
    for v in ordered[:500]:
        parts.append(
            f"<tr><td>{v.step}</td><td>{esc(v.run)}</td><td>{esc(str(v.ranks))}</td><td>{esc(v.stage)}</td>"
            f"<td>{esc(v.description)}</td><td><pre>{esc(_short(v.evidence, 600))}</pre></td></tr>"
        )
    if len(ordered) > 500:
        parts.append(f"<tr><td colspan='6' class='muted'>{len(ordered) - 500} more in the JSON report</td></tr>")
    parts.append("</table></body></html>")
    return "".join(parts)


def preconditions_by_id(invariants: Iterable[Any]) -> dict[str, Any]:
    return {inv.id: inv.precondition for inv in invariants}
