"""`trainwatch check [-i INVARIANTS.json] TRACE_DIR [--report-json F] [--report-html F]`.

Replays trace files through the same engine the streaming checker drives.  Exit codes:
0 no violation, 1 violations, 2 bad usage or unreadable input (one-line reason).
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


def run(args: argparse.Namespace) -> int:
    from invariants.engine import Engine, StepWindows
    from invariants.invariant_file import InvariantFileError, load_default_set, load_set
    from invariants.report import CheckSummary, preconditions_by_id, render_html, render_json, render_text
    from invariants.wire import wire_types

    from ..tracedir import TraceDirError, TraceReadReport, read_trace_dir

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
    windows = StepWindows.replay(engine)
    wire = wire_types(engine.plan.kept_attrs())  # decodes only what the deployed invariants read
    report = TraceReadReport()
    violations = []
    runs: list[str] = []
    try:
        for batch in read_trace_dir(args.trace_dir, report, decode=wire.decode):
            if batch.run not in runs:
                runs.append(batch.run)
            violations.extend(windows.feed(batch))
    except TraceDirError as exc:
        return _fail(str(exc))
    violations.extend(windows.finish())

    summary = CheckSummary(
        invariants=len(invariant_set), runs=runs, batches=report.batches, events=report.events,
        windows=sum(r.windows_closed for r in windows.runs.values()), late_batches=windows.late_batches,
        partial_windows=windows.partial_windows,
        truncated=report.truncated, source=str(args.trace_dir),
    )
    pres = preconditions_by_id(invariant_set.invariants)
    sys.stdout.write(render_text(violations, summary, pres))
    try:
        if args.report_json:
            Path(args.report_json).write_text(json.dumps(render_json(violations, summary), indent=1, sort_keys=True, default=str) + "\n",
                                              encoding="utf-8")
        if args.report_html:
            Path(args.report_html).write_text(render_html(violations, summary, pres), encoding="utf-8")
    except OSError as exc:
        return _fail(f"cannot write report: {exc.strerror or exc}")
    return EXIT_VIOLATIONS if violations else EXIT_OK
