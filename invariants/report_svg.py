"""Small inline SVG charts for the HTML report: a per-step line chart and a rank-by-step heat grid.

A report is opened from a CI artifact or an e-mail, often offline and from a sandboxed
viewer, so the charts are plain SVG markup inside the page: no script, no font or
stylesheet fetched from anywhere, and every piece of text escaped because run, rank
and variable names come from the traced program.  Pure: strings in, a string out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape
from typing import Callable, Iterable

#: More points than this are thinned (the marked steps are always kept): a chart of a
#: 100,000-step run stays a few tens of kilobytes and still shows where the marks are.
MAX_POINTS = 600
#: Columns of a heat grid beyond this are summarised in its caption instead of drawn.
MAX_COLUMNS = 60

LINE, MARK, NONFINITE, GRID, TEXT = "#1f6fb2", "#c62828", "#8e24aa", "#e3e6ea", "#4a5560"


@dataclass(frozen=True)
class Series:
    """One signal over the steps of a run; ``None`` where the step did not record it."""

    title: str
    points: list[tuple[int, float | None]]
    log: bool = False  # norms and ratios span orders of magnitude


@dataclass(frozen=True)
class RankGrid:
    """How far each rank stood from the others at each violated step of one cross-rank rule.

    ``cells`` maps (rank, step) to a disagreement in [0, 1]: 0 = with the majority,
    1 = the most apart seen in this grid; a pair that is absent was not reported."""

    title: str
    ranks: list[int]
    steps: list[int]
    cells: dict[tuple[int, int], float] = field(default_factory=dict)
    notes: dict[tuple[int, int], str] = field(default_factory=dict)  # hover text per cell


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if 1e-3 <= abs(value) < 1e5:
        return f"{value:.4g}"
    return f"{value:.2e}"


def _thin(points: list[tuple[int, float | None]], keep: set[int]) -> list[tuple[int, float | None]]:
    """At most about MAX_POINTS points; the marked ones stay unless they alone are too many."""
    if len(points) <= MAX_POINTS:
        return points
    stride = math.ceil(len(points) / MAX_POINTS)
    last = len(points) - 1
    keep = keep if len(keep) <= MAX_POINTS else set()
    return [p for i, p in enumerate(points) if i % stride == 0 or i == last or p[0] in keep]


def _bands(marked: list[int], x: Callable[[int], float]) -> list[tuple[int, int]]:
    """Marked steps as (first, last) bands: a step next to the band before it (by step, or
    within two pixels) joins it, so a rule violated on every step is one band, not a
    thousand lines."""
    bands: list[tuple[int, int]] = []
    for step in marked:
        if bands and (step == bands[-1][1] + 1 or x(step) - x(bands[-1][1]) < 2):
            bands[-1] = (bands[-1][0], step)
        else:
            bands.append((step, step))
    return bands


def line_chart(series: Series, marks: Iterable[int], *, width: int = 360, height: int = 170) -> str:
    """``series`` as a polyline; each step in ``marks`` (a violation) as a red rule and dot;
    NaN/inf values as purple triangles along the top edge."""
    marked = set(marks)
    points = _thin(sorted(series.points), marked)
    finite = {s: v for s, v in points if v is not None and math.isfinite(v)}
    log = series.log and any(v > 0 for v in finite.values())
    plotted = finite
    if log:  # a zero (a vanished gradient, a frozen update) sits a decade below the smallest value
        plotted = {s: math.log10(v) for s, v in finite.items() if v > 0}
        floor = min(plotted.values()) - 1
        plotted.update({s: floor for s, v in finite.items() if v <= 0})
    left, right, top, bottom = 64, 12, 24, 26
    inner_w, inner_h = width - left - right, height - top - bottom
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' class='chart' width='{width}' height='{height}' "
             f"viewBox='0 0 {width} {height}' role='img' aria-label='{escape(series.title)}'>",
             f"<rect x='0' y='0' width='{width}' height='{height}' fill='#ffffff'/>",
             f"<text x='{left}' y='15' font-size='12' font-weight='600' fill='{TEXT}'>"
             f"{escape(series.title)}{' (log scale)' if log else ''}</text>",
             f"<rect x='{left}' y='{top}' width='{inner_w}' height='{inner_h}' fill='#fafbfc' stroke='{GRID}'/>"]
    steps = [s for s, _ in points] + sorted(marked)
    if not steps:
        parts.append(f"<text x='{left + 8}' y='{top + inner_h / 2:.0f}' font-size='12' fill='{TEXT}'>"
                     "not recorded in these traces</text></svg>")
        return "".join(parts)
    lo_s, hi_s = min(steps), max(steps)
    lo_v, hi_v = (min(plotted.values()), max(plotted.values())) if plotted else (0.0, 1.0)
    if hi_v == lo_v:
        lo_v, hi_v = lo_v - 0.5, hi_v + 0.5

    def x(step: int) -> float:
        return left + (inner_w * (step - lo_s) / (hi_s - lo_s) if hi_s > lo_s else inner_w / 2)

    def y(value: float) -> float:
        return top + inner_h - inner_h * (value - lo_v) / (hi_v - lo_v)

    for value, anchor in ((hi_v, top + 4), (lo_v, top + inner_h)):
        label = _fmt(10 ** value if log else value)
        parts.append(f"<text x='{left - 4}' y='{anchor + 4:.0f}' font-size='10' text-anchor='end' "
                     f"fill='{TEXT}'>{escape(label)}</text>")
    for step, anchor in ((lo_s, "start"), (hi_s, "end")):
        parts.append(f"<text x='{x(step):.1f}' y='{height - 8}' font-size='10' text-anchor='{anchor}' "
                     f"fill='{TEXT}'>step {step}</text>")
    for first, last in _bands(sorted(marked), x):
        if first == last:
            parts.append(f"<line class='mark' x1='{x(first):.1f}' y1='{top}' x2='{x(first):.1f}' y2='{top + inner_h}' "
                         f"stroke='{MARK}' stroke-opacity='0.45' stroke-width='1.5'><title>violation at step {first}"
                         "</title></line>")
        else:
            parts.append(f"<rect class='mark' x='{x(first) - 0.75:.1f}' y='{top}' width='{x(last) - x(first) + 1.5:.1f}' "
                         f"height='{inner_h}' fill='{MARK}' fill-opacity='0.16'><title>violations at steps "
                         f"{first}..{last}</title></rect>")
    run: list[str] = []
    for step, value in points:
        shown = plotted.get(step)
        if shown is None:
            if len(run) > 1:
                parts.append(f"<polyline fill='none' stroke='{LINE}' stroke-width='1.6' points='{' '.join(run)}'/>")
            run = []
            if value is not None and not math.isfinite(value):
                cx = x(step)
                parts.append(f"<path class='nonfinite' d='M{cx - 5:.1f},{top + 1} L{cx + 5:.1f},{top + 1} "
                             f"L{cx:.1f},{top + 9} Z' fill='{NONFINITE}'><title>step {step}: {escape(str(value))}"
                             "</title></path>")
            continue
        run.append(f"{x(step):.1f},{y(shown):.1f}")
        if step in marked:
            parts.append(f"<circle class='mark' cx='{x(step):.1f}' cy='{y(shown):.1f}' r='3.2' fill='{MARK}'>"
                         f"<title>step {step}: {escape(_fmt(value))}</title></circle>")  # type: ignore[arg-type]
    if len(run) > 1:
        parts.append(f"<polyline fill='none' stroke='{LINE}' stroke-width='1.6' points='{' '.join(run)}'/>")
    elif len(run) == 1:
        cx, cy = run[0].split(",")
        parts.append(f"<circle cx='{cx}' cy='{cy}' r='2.5' fill='{LINE}'/>")
    parts.append("</svg>")
    return "".join(parts)


def _heat(value: float) -> str:
    """White-to-red for disagreement; a pale green for a rank that sided with the majority."""
    if value <= 0:
        return "#dff3e4"
    t = min(1.0, max(0.15, value))
    return f"rgb({int(255 - 57 * t)},{int(235 - 195 * t)},{int(235 - 195 * t)})"


def rank_heatmap(grid: RankGrid, *, cell: int = 14) -> str:
    """Rows are ranks, columns the violated steps: which rank stood apart, and when.
    The title and legend are the caller's to set in HTML, where long names wrap."""
    steps = grid.steps[:MAX_COLUMNS]
    left, top = 56, 16
    width = left + cell * max(len(steps), 1) + 8
    height = top + cell * len(grid.ranks) + 4
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' class='grid' width='{width}' height='{height}' "
             f"viewBox='0 0 {width} {height}' role='img' aria-label='{escape(grid.title)}'>",
             f"<rect x='0' y='0' width='{width}' height='{height}' fill='#ffffff'/>"]
    label_every = max(1, math.ceil(len(steps) / 10))
    for col, step in enumerate(steps):
        if col % label_every == 0:
            parts.append(f"<text x='{left + col * cell + cell / 2:.1f}' y='{top - 5}' font-size='9' "
                         f"text-anchor='middle' fill='{TEXT}'>{step}</text>")
    for row, rank in enumerate(grid.ranks):
        y = top + row * cell
        parts.append(f"<text x='{left - 6}' y='{y + cell - 3}' font-size='10' text-anchor='end' "
                     f"fill='{TEXT}'>rank {rank}</text>")
        for col, step in enumerate(steps):
            value = grid.cells.get((rank, step))
            fill = "#f1f2f4" if value is None else _heat(value)
            note = grid.notes.get((rank, step)) or ("not reported" if value is None else f"{value:.2f}")
            parts.append(f"<rect x='{left + col * cell}' y='{y}' width='{cell - 1}' height='{cell - 1}' "
                         f"fill='{fill}'><title>rank {rank}, step {step}: {escape(note)}</title></rect>")
    parts.append("</svg>")
    return "".join(parts)
