"""The pictures of the HTML report: per-step signals, cross-rank disagreement, what was checked.

A violation list says *which* rule broke; a person deciding whether to stop a job
wants to see it against the run: did the loss move at the marked step, did the
gradient norm jump, which rank walked away from the others and from when on.  And a
clean verdict is only worth what was checked, so a clean page shows the rules by
relation, the steps and the ranks it covered instead of a lone "OK".
Pure: data in, escaped HTML out (`report_html` assembles the page).
"""

from __future__ import annotations

import math
import statistics
from html import escape
from typing import Any, Iterable

from .coverage import Coverage
from .coverage_text import describe_run, rank_ranges
from .model import Violation
from .report_svg import MAX_COLUMNS, RankGrid, Series, line_chart, rank_heatmap
from .step_summary import StepSummary

#: Runs drawn with their own charts; more are named, not drawn (one check can cover many).
MAX_CHARTED_RUNS = 4
#: Violated cross-rank rules given a heat grid each.
MAX_GRIDS = 6


def signal_series(steps: Iterable[StepSummary]) -> list[Series]:
    """Loss, gradient norm and update ratio of one run's steps (a step without an optimizer
    step, such as the setup window, has none of them and is left out)."""
    rows = [s for s in steps if s.loss is not None or s.grad_norm is not None or s.update_ratio is not None]
    return [Series("loss", [(s.step, s.loss) for s in rows if s.loss is not None]),
            Series("gradient norm", [(s.step, s.grad_norm) for s in rows if s.grad_norm is not None], log=True),
            Series("update ratio ‖Δw‖/‖w‖", [(s.step, s.update_ratio) for s in rows if s.update_ratio is not None],
                   log=True)]


def signals_section(steps: list[StepSummary], violations: list[Violation]) -> str:
    """One row of charts per run, every violated step marked on each chart."""
    by_run: dict[str, list[StepSummary]] = {}
    for summary in steps:
        by_run.setdefault(summary.run, []).append(summary)
    parts = ["<h2>Per-step signals</h2>"]
    drawn = [run for run, rows in by_run.items() if any(s.loss is not None or s.grad_norm is not None
                                                         or s.update_ratio is not None for s in rows)]
    if not drawn:
        parts.append("<p class='muted'>These traces hold no loss, gradient norm or parameter snapshot "
                     "around the optimizer step to draw.</p>")
        return "".join(parts)
    for run in drawn[:MAX_CHARTED_RUNS]:
        marks = sorted({v.step for v in violations if v.run == run})
        legend = (f"{len(marks)} step(s) with violations marked in red" if marks
                  else "no violation to mark")
        parts.append(f"<h3>run <code>{escape(run)}</code> <span class='muted'>{escape(legend)}</span></h3>"
                     "<div class='charts'>"
                     + "".join(line_chart(series, marks) for series in signal_series(by_run[run])) + "</div>")
    if len(drawn) > MAX_CHARTED_RUNS:
        rest = ", ".join(drawn[MAX_CHARTED_RUNS:])
        parts.append(f"<p class='muted'>Not drawn: run(s) {escape(rest)}.</p>")
    return "".join(parts)


def _number(value: Any) -> float | None:
    if value.__class__ in (int, float) and math.isfinite(value):
        return float(value)
    return None


def _rank(key: Any) -> int | None:
    try:
        return int(key)
    except (TypeError, ValueError):
        return None


def _consistency_cells(first: dict[str, Any], odd: list[int]) -> dict[int, tuple[float, str]]:
    """Per rank of one replica check: how far its norm is from the median of the ranks
    (relative), with a floor for a rank whose digest differs at an equal norm."""
    values = first.get("values_by_rank")
    if not isinstance(values, dict):
        return {}
    norms_raw = first.get("data_norm_by_rank", first.get("grad_norm_by_rank"))
    norms = {_rank(k): _number(v) for k, v in norms_raw.items()} if isinstance(norms_raw, dict) else {}
    known = [n for n in norms.values() if n is not None]
    median = statistics.median(known) if known else None
    cells: dict[int, tuple[float, str]] = {}
    for key in values:
        rank = _rank(key)
        if rank is None:
            continue
        norm = norms.get(rank)
        apart = 0.0
        if norm is not None and median is not None:
            apart = abs(norm - median) / abs(median) if median else abs(norm)
        if rank in odd:
            apart = max(apart, 1e-12)  # a differing digest at an equal norm is still apart
        note = ("apart from the majority" if rank in odd else "with the majority") + (
            f", norm {norm:.6g}" if norm is not None else "")
        cells[rank] = (apart, note)
    return cells


def _missing_cells(first: dict[str, Any]) -> dict[int, tuple[float, str]]:
    cells: dict[int, tuple[float, str]] = {}
    for key in first.get("reported") or []:
        if _rank(key) is not None:
            cells[_rank(key)] = (0.0, "reported the step")  # type: ignore[index]
    for key in first.get("missing") or []:
        if _rank(key) is not None:
            cells[_rank(key)] = (1.0, "did not report the step")  # type: ignore[index]
    return cells


def rank_grids(violations: list[Violation]) -> list[RankGrid]:
    """A heat grid per violated cross-rank rule (replicas that must agree, every rank
    reporting each step), first-violated rule first."""
    per_rule: dict[str, dict[tuple[int, int], tuple[float, str]]] = {}
    titles: dict[str, str] = {}
    for v in sorted(violations, key=Violation.sort_key):
        first = v.evidence.get("first") if isinstance(v.evidence, dict) else None
        if not isinstance(first, dict):
            continue
        if "values_by_rank" in first:
            cells = _consistency_cells(first, [r for r in v.ranks if isinstance(r, int)])
            what = f"{v.description} — {first.get('variable', '?')} ({first.get('attr', '?')})"
        elif "missing" in first:
            cells, what = _missing_cells(first), v.description
        else:
            continue
        if not cells:
            continue
        key = f"{v.run}\x00{v.invariant}"
        titles.setdefault(key, f"run {v.run}: {what}")
        grid = per_rule.setdefault(key, {})
        for rank, cell in cells.items():
            grid.setdefault((rank, v.step), cell)
    grids = []
    for key, cells in list(per_rule.items())[:MAX_GRIDS]:
        top = max((value for value, _ in cells.values()), default=0.0) or 1.0
        grids.append(RankGrid(
            title=titles[key],
            ranks=sorted({rank for rank, _ in cells}),
            steps=sorted({step for _, step in cells}),
            cells={k: (value / top if value > 0 else 0.0) for k, (value, _) in cells.items()},
            notes={k: note for k, (_, note) in cells.items()},
        ))
    return grids


def disagreement_section(violations: list[Violation]) -> str:
    grids = rank_grids(violations)
    if not grids:
        return ""
    parts = ["<h2>Which rank disagreed</h2><p class='muted'>Each violated cross-rank rule: its ranks by the "
             "steps it was violated at. Red: apart from the other ranks, darker the further its parameter norm "
             "stood from the ranks' median; green: with the majority; grey: not reported.</p>"]
    for grid in grids:
        more = len(grid.steps) - MAX_COLUMNS
        parts.append(f"<figure class='heat'><figcaption>{escape(grid.title)}</figcaption>{rank_heatmap(grid)}"
                     + (f"<figcaption class='muted'>{more} later step(s) not drawn</figcaption>" if more > 0 else "")
                     + "</figure>")
    return "".join(parts)


def checked_section(rules_by_relation: dict[str, int], coverage: Coverage, windows: int) -> str:
    """Rules by relation, the steps and the ranks a verdict covered."""
    runs = list(coverage.runs.values())
    iterations = sum(r.iterations for r in runs)
    ranks = sorted({rank for r in runs for rank in (r.ranks or range(r.world))})
    tiles = [(f"{sum(rules_by_relation.values())}", "rules checked"),
             (f"{len(rules_by_relation)}", "relations"),
             (f"{iterations}", "training iterations"),
             (f"{windows}", "step windows"),
             (f"{len(ranks)}", f"{'rank' if len(ranks) == 1 else 'ranks'} {rank_ranges(ranks)}")]
    parts = ["<h2>What was checked</h2><div class='tiles'>"]
    parts.extend(f"<div class='tile'><b>{escape(value)}</b><span>{escape(label)}</span></div>" for value, label in tiles)
    parts.append("</div>")
    if rules_by_relation:
        widest = max(rules_by_relation.values())
        parts.append("<table class='relations'><tr><th>Relation</th><th>Rules</th><th></th></tr>")
        for relation, count in sorted(rules_by_relation.items(), key=lambda kv: (-kv[1], kv[0])):
            bar = max(2, round(240 * count / widest))
            parts.append(f"<tr><td><code>{escape(relation)}</code></td><td>{count}</td><td>"
                         f"<svg xmlns='http://www.w3.org/2000/svg' width='244' height='12'><rect x='0' y='1' "
                         f"width='{bar}' height='10' fill='#2e9e50'/></svg></td></tr>")
        parts.append("</table>")
    parts.append("<ul class='coverage'>" + "".join(f"<li>{escape(describe_run(run))}</li>" for run in runs) + "</ul>")
    return "".join(parts)
