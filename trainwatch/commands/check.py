"""`trainwatch check [-i INVARIANTS.json] TRACE_DIR [--report-json F] [--report-html F]`.

Replays trace files through the same engine the streaming checker drives.  Exit codes:
0 no violation, 1 violations, 2 bad usage, unreadable input, or nothing to judge: no
batch at all, or a run without a training iteration (one-line reason each).
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


def _fail(message: str) -> int:
    print(f"trainwatch check: error: {message}", file=sys.stderr)
    return EXIT_UNREADABLE


def _unwritable_report(args: argparse.Namespace) -> str | None:
    """A report file that cannot be written, found before checking rather than after the verdict."""
    for path in filter(None, (args.report_json, args.report_html)):
        parent = Path(path).parent
        if not parent.is_dir():
            return f"cannot write report {path}: no such directory {parent}"
    return None


def run(args: argparse.Namespace) -> int:
    from invariants.coverage import LATE_BATCH, Coverage
    from invariants.engine import Engine
    from invariants.step_windows import StepWindows
    from invariants.invariant_file import InvariantFileError, load_default_set, load_set
    from invariants.report import (CheckSummary, preconditions_by_id, render_html, render_json, render_text,
                                   untrained_lines)
    from invariants.wire import wire_types

    from ..trace_runs import per_run_note
    from ..tracedir import TraceDirError, TraceReadReport, read_trace_dir

    unwritable = _unwritable_report(args)
    if unwritable:
        return _fail(unwritable)
    try:
        if args.invariants:
            path = Path(args.invariants)
            try:
                text = path.read_bytes()  # the loader names a non-UTF-8 file
            except OSError as exc:
                return _fail(f"{path}: cannot read: {exc.strerror or exc}")
            invariant_set = load_set(text, str(path))
        else:
            invariant_set = load_default_set()
    except InvariantFileError as exc:
        return _fail(str(exc))

    # files are merged in step order: a window is complete once the replay passes its step
    engine = Engine(invariant_set)
    coverage = Coverage()
    windows = StepWindows.replay(engine, on_close=coverage.window_closed, on_unfinished=coverage.window_unfinished)
    wire = wire_types(engine.plan.kept_attrs())  # decodes only what the deployed invariants read
    report = TraceReadReport()
    violations = []
    runs: list[str] = []
    try:
        for batch in read_trace_dir(args.trace_dir, report, decode=wire.decode):
            if batch.run not in runs:
                runs.append(batch.run)
            coverage.sequence.see(batch.run, batch.rank, batch.pid, batch.seq)
            late = windows.late_batches
            violations.extend(windows.feed(batch))
            if windows.late_batches > late:
                coverage.run(batch.run).note_lost(LATE_BATCH, 1)
    except TraceDirError as exc:
        return _fail(str(exc))
    if not runs:
        return _fail(f"{args.trace_dir}: no batch in {len(report.files)} trace file(s) (empty or header-only): "
                     "nothing to check")
    violations.extend(windows.finish())
    coverage.finish()

    summary = CheckSummary(
        invariants=len(invariant_set), runs=runs, batches=report.batches, events=report.events,
        windows=sum(r.windows_closed for r in windows.runs.values()), late_batches=windows.late_batches,
        partial_windows=windows.partial_windows,
        truncated=report.truncated, source=str(args.trace_dir), coverage=coverage,
    )
    pres = preconditions_by_id(invariant_set.invariants)
    mixed = per_run_note(windows.runs, violations)
    sys.stdout.write((mixed + "\n" if mixed else "") + render_text(violations, summary, pres))
    try:
        if args.report_json:
            Path(args.report_json).write_text(json.dumps(render_json(violations, summary), indent=1, sort_keys=True, default=str) + "\n",
                                              encoding="utf-8")
        if args.report_html:
            Path(args.report_html).write_text(render_html(violations, summary, pres), encoding="utf-8")
    except OSError as exc:
        return _fail(f"cannot write report {exc.filename or ''}: {exc.strerror or exc}")
    if violations:
        return EXIT_VIOLATIONS
    untrained = untrained_lines(violations, summary)
    for line in untrained:
        print(f"trainwatch check: {line}", file=sys.stderr)
    return EXIT_UNREADABLE if untrained else EXIT_OK
