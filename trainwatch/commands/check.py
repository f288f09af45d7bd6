"""`trainwatch check [-i INVARIANTS.json] TRACE_DIR [--report-json F] [--report-html F]`.

Replays trace files through the same engine the streaming checker drives.  Exit codes:
0 no violation, 1 violations, 2 bad usage, unreadable input, or nothing to judge: no
batch at all, or a run without a training iteration (one-line reason each).
`trainwatch report` is the same check with the HTML page as its product (`check_traces`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXIT_OK, EXIT_VIOLATIONS, EXIT_UNREADABLE = 0, 1, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace_dir", metavar="TRACE_DIR", help="directory of *.twtrace files (from `trainwatch collect`)")
    parser.add_argument("-i", "--invariants", metavar="INVARIANTS.json",
                        help="invariant file (default: the shipped curated set)")
    parser.add_argument("--report-json", metavar="FILE", help="write the full report as JSON")
    parser.add_argument("--report-html", metavar="FILE", help="write a self-contained HTML report")


def _fail(command: str, message: str) -> int:
    print(f"trainwatch {command}: error: {message}", file=sys.stderr)
    return EXIT_UNREADABLE


def _unwritable_report(paths: list[str]) -> str | None:
    """A report file that cannot be written, found before checking rather than after the verdict."""
    for path in paths:
        parent = Path(path).parent
        if not parent.is_dir():
            return f"cannot write report {path}: no such directory {parent}"
        if Path(path).is_dir():
            return f"cannot write report {path}: it is a directory"
    return None


def run(args: argparse.Namespace) -> int:
    return check_traces(args.trace_dir, args.invariants, command="check",
                        report_json=args.report_json, report_html=args.report_html)


def check_traces(trace_dir: str, invariants: str | None, *, command: str, report_json: str | None = None,
                 report_html: str | None = None, announce_html: bool = False) -> int:
    """Check a trace directory, print the verdict and write the reports asked for; the exit code.

    Shared by ``check`` and ``report``: one verdict, one page, whichever command drew it."""
    from invariants.coverage import LATE_BATCH, Coverage
    from invariants.engine import Engine
    from invariants.step_windows import StepWindows
    from invariants.invariant_file import InvariantFileError, load_default_set, load_set
    from invariants.report import (CheckSummary, preconditions_by_id, render_json, render_text, rules_by_relation,
                                   untrained_lines)
    from invariants.report_html import render_html
    from invariants.step_summary import SUMMARY_STATE_ATTRS, StepSeries
    from invariants.wire import wire_types

    from ..trace_runs import per_run_note
    from ..tracedir import TraceDirError, TraceReadReport, read_trace_dir

    def fail(message: str) -> int:
        return _fail(command, message)

    unwritable = _unwritable_report([p for p in (report_json, report_html) if p])
    if unwritable:
        return fail(unwritable)
    try:
        if invariants:
            path = Path(invariants)
            try:
                text = path.read_bytes()  # the loader names a non-UTF-8 file
            except OSError as exc:
                return fail(f"{path}: cannot read: {exc.strerror or exc}")
            invariant_set = load_set(text, str(path))
        else:
            invariant_set = load_default_set()
    except InvariantFileError as exc:
        return fail(str(exc))

    # files are merged in step order: a window is complete once the replay passes its step
    engine = Engine(invariant_set)
    coverage = Coverage()
    windows = StepWindows.replay(engine, on_close=coverage.window_closed, on_unfinished=coverage.window_unfinished)
    # decodes only what the deployed invariants read, and for a page the step signals too
    kept = engine.plan.kept_attrs()
    signals = StepSeries() if report_html else None
    wire = wire_types(None if kept is None or signals is None else (*kept, *SUMMARY_STATE_ATTRS))
    report = TraceReadReport()
    violations = []
    runs: list[str] = []
    try:
        for batch in read_trace_dir(trace_dir, report, decode=wire.decode):
            if batch.run not in runs:
                runs.append(batch.run)
            coverage.sequence.see(batch.run, batch.rank, batch.pid, batch.seq)
            late = windows.late_batches
            violations.extend(windows.feed(batch))
            if signals is not None:
                signals.add_batch(batch)
            if windows.late_batches > late:
                coverage.run(batch.run).note_lost(LATE_BATCH, 1)
    except TraceDirError as exc:
        return fail(str(exc))
    if not runs:
        return fail(f"{trace_dir}: no batch in {len(report.files)} trace file(s) (empty or header-only): "
                     "nothing to check")
    violations.extend(windows.finish())
    coverage.finish()

    summary = CheckSummary(
        invariants=len(invariant_set), runs=runs, batches=report.batches, events=report.events,
        windows=sum(r.windows_closed for r in windows.runs.values()), late_batches=windows.late_batches,
        partial_windows=windows.partial_windows,
        truncated=report.truncated, source=str(trace_dir), coverage=coverage,
        rules_by_relation=rules_by_relation(invariant_set.invariants),
        steps=signals.summaries() if signals is not None else [],
    )
    pres = preconditions_by_id(invariant_set.invariants)
    mixed = per_run_note(windows.runs, violations)
    sys.stdout.write((mixed + "\n" if mixed else "") + render_text(violations, summary, pres))
    try:
        if report_json:
            document = json.dumps(render_json(violations, summary), indent=1, sort_keys=True, default=str)
            Path(report_json).write_text(document + "\n", encoding="utf-8")
        if report_html:
            Path(report_html).write_text(render_html(violations, summary, pres), encoding="utf-8")
            if announce_html:
                print(f"report: {report_html}")
    except OSError as exc:
        return fail(f"cannot write report {exc.filename or ''}: {exc.strerror or exc}")
    if violations:
        return EXIT_VIOLATIONS
    untrained = untrained_lines(violations, summary)
    for line in untrained:
        print(f"trainwatch {command}: {line}", file=sys.stderr)
    return EXIT_UNREADABLE if untrained else EXIT_OK
