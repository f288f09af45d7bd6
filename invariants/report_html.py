"""The self-contained HTML page of a check: verdict, pictures, then the detail.

One file that opens anywhere — a CI artifact, an attachment, an air-gapped cluster's
login node — so the style is inline, the charts are inline SVG, there is no script
and nothing is fetched.  The page leads with what a person decides on (the verdict,
the first violation, the signals around it, which rank disagreed) and ends with the
tables a person digs in.  Every text that came from a trace is escaped.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

from .model import Violation
from .precondition import describe_precondition
from .report import CheckSummary, group_violations, short_json, untrained_lines
from .report_sections import checked_section, disagreement_section, signals_section

#: Rows of the every-violation table; the JSON report has them all.
MAX_ROWS = 500

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem;color:#1d232a;max-width:76rem;background:#fff}
h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:2rem}h3{font-size:.95rem;margin:1rem 0 .4rem}
.ok{background:#e8f6ec;border-left:4px solid #2e9e50;padding:.8rem 1rem}
.nothing{background:#fff6e0;border-left:4px solid #d08a00;padding:.8rem 1rem}
.bad{background:#fdecea;border-left:4px solid #c62828;padding:.8rem 1rem}
.first{background:#fdecea;border-left:4px solid #c62828;padding:.8rem 1rem}
.first dt{font-weight:600;margin-top:.4rem}.first dd{margin-left:1rem}
.charts{display:flex;flex-wrap:wrap;gap:.6rem}.charts svg,.heat svg{border:1px solid #e3e6ea;border-radius:.3rem}
.heat{margin:.8rem 0;overflow-x:auto}.heat figcaption{font-size:.85rem;margin:.2rem 0}
.tiles{display:flex;flex-wrap:wrap;gap:.6rem;margin:.6rem 0}
.tile{border:1px solid #e3e6ea;border-radius:.4rem;padding:.5rem .9rem;min-width:7rem}
.tile b{display:block;font-size:1.3rem}.tile span{color:#66707a;font-size:.85rem}
table{border-collapse:collapse;width:100%;font-size:.9rem}th,td{border-bottom:1px solid #ddd;padding:.35rem .5rem;text-align:left;vertical-align:top}
table.relations{width:auto}
th{background:#f4f5f7}code,pre{font-family:ui-monospace,Menlo,monospace;font-size:.85rem}
pre{white-space:pre-wrap;word-break:break-all;margin:0}.muted{color:#66707a;font-weight:normal}
.badge{background:#eef;padding:0 .4rem;border-radius:.3rem}
"""


def _first_violation(first: Violation, preconditions: dict[str, Any] | None) -> str:
    applies = ""
    if preconditions and preconditions.get(first.invariant) is not None:
        applies = f"<dt>Applies when</dt><dd>{escape(describe_precondition(preconditions[first.invariant]))}</dd>"
    evidence = json.dumps(first.evidence, indent=1, sort_keys=True, default=str)
    return ("<h2>First violation</h2><dl class='first'>"
            f"<dt>Where</dt><dd>step <b>{first.step}</b> of run <code>{escape(first.run)}</code>, ranks "
            f"{escape(str(first.ranks))}, stage <span class='badge'>{escape(first.stage or '-')}</span></dd>"
            f"<dt>What should have held</dt><dd>{escape(first.description)}</dd>{applies}"
            f"<dt>What was seen</dt><dd><pre>{escape(evidence)}</pre></dd>"
            f"<dt>Likely cause</dt><dd>{escape(first.hint or '-')}</dd>"
            f"<dt>Rule</dt><dd><code>{escape(first.relation)}</code> <code>{escape(first.invariant)}</code></dd></dl>")


def _violation_tables(ordered: list[Violation]) -> str:
    parts = ["<h2>All violated invariants</h2><table><tr><th>Invariant</th><th>Occurrences</th><th>Steps</th>"
             "<th>Ranks</th><th>Likely cause</th></tr>"]
    for g in group_violations(ordered):
        parts.append(
            f"<tr><td>{escape(g['description'])}<br><span class='muted'>{escape(g['relation'])} "
            f"{escape(g['invariant'])}</span></td><td>{g['count']}</td><td>{g['first_step']}&ndash;{g['last_step']}</td>"
            f"<td>{escape(str(sorted(g['ranks'])))}</td><td>{escape(g['hint'] or '-')}</td></tr>")
    parts.append("</table><h2>Every violation</h2><table><tr><th>Step</th><th>Run</th><th>Ranks</th><th>Stage</th>"
                 "<th>Invariant</th><th>Evidence</th></tr>")
    for v in ordered[:MAX_ROWS]:
        parts.append(
            f"<tr><td>{v.step}</td><td>{escape(v.run)}</td><td>{escape(str(v.ranks))}</td><td>{escape(v.stage or '-')}</td>"
            f"<td>{escape(v.description)}</td><td><pre>{escape(short_json(v.evidence, 600))}</pre></td></tr>")
    if len(ordered) > MAX_ROWS:
        parts.append(f"<tr><td colspan='6' class='muted'>{len(ordered) - MAX_ROWS} more in the JSON report</td></tr>")
    parts.append("</table>")
    return "".join(parts)


def render_html(violations: list[Violation], summary: CheckSummary, preconditions: dict[str, Any] | None = None) -> str:
    ordered = sorted(violations, key=Violation.sort_key)
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>trainwatch check report</title>",
        f"<style>{_CSS}</style></head><body><h1>trainwatch check report</h1>",
        f"<p class='muted'>{escape(summary.source)} &middot; runs: {escape(', '.join(summary.runs) or '-')} &middot; "
        f"{summary.windows} step windows, {summary.events} events, {summary.invariants} invariants checked</p>",
    ]
    parts.extend(f"<p class='muted'>Torn last record skipped: {escape(path)} at byte offset {offset}.</p>"
                 for path, offset in summary.truncated)
    checked = checked_section(summary.rules_by_relation, summary.coverage, summary.windows)
    signals = signals_section(summary.steps, ordered)
    if not ordered:
        untrained = untrained_lines(ordered, summary)
        if untrained:
            parts.extend(f"<p class='nothing'>{escape(line)}</p>" for line in untrained)
        else:
            parts.append("<p class='ok'>No violation: every invariant held at every step checked.</p>")
        parts.extend([checked, signals, "</body></html>"])
        return "".join(parts)
    groups = group_violations(ordered)
    parts.append(f"<p class='bad'><b>{len(ordered)} violation(s) of {len(groups)} invariant(s)</b>, the first at "
                 f"step {ordered[0].step} of run <code>{escape(ordered[0].run)}</code>.</p>")
    parts.extend([signals, disagreement_section(ordered), _first_violation(ordered[0], preconditions),
                  _violation_tables(ordered), checked, "</body></html>"])
    return "".join(parts)
