"""`trainwatch infer TRACE_DIR... -o INVARIANTS.json [--enable-relation R ...] [--disable-relation R ...]`.

Each TRACE_DIR is one healthy reference run.  The output is deterministic: the same
traces give a byte-identical file.  Exit 0 on success, 2 on bad usage/unreadable input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace_dirs", nargs="+", metavar="TRACE_DIR", help="trace directories of healthy runs")
    parser.add_argument("-o", "--output", required=True, metavar="INVARIANTS.json", help="where to write the invariants")
    parser.add_argument("--enable-relation", action="append", default=[], metavar="RELATION",
                        help="infer only these relations (repeatable)")
    parser.add_argument("--disable-relation", action="append", default=[], metavar="RELATION",
                        help="skip these relations (repeatable)")


def _fail(message: str) -> int:
    print(f"trainwatch infer: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from invariants.inference import Inferencer
    from invariants.invariant_file import dumps
    from invariants.relations import TEMPLATES
    from invariants.wire import wire_types

    from ..tracedir import TraceDirError, TraceReadReport, read_trace_dir

    known = set(TEMPLATES)
    for name in args.enable_relation + args.disable_relation:
        if name not in known:
            return _fail(f"unknown relation {name!r} (known: {', '.join(sorted(known))})")
    relations = set(args.enable_relation) if args.enable_relation else set(known)
    relations -= set(args.disable_relation)
    if not relations:
        return _fail("every relation is disabled")

    inferencer = Inferencer(relations)
    report = TraceReadReport()
    try:
        for trace_dir in args.trace_dirs:
            inferencer.add_trace(read_trace_dir(trace_dir, report, decode=wire_types(None).decode))
    except TraceDirError as exc:
        return _fail(str(exc))
    invariants = inferencer.finish()
    try:
        Path(args.output).write_text(dumps(invariants), encoding="utf-8")
    except OSError as exc:
        return _fail(f"cannot write {args.output}: {exc.strerror or exc}")
    for path, offset in report.truncated:
        print(f"note: {path}: torn last record at byte offset {offset} was skipped", file=sys.stderr)
    by_relation: dict[str, int] = {}
    for inv in invariants:
        by_relation[inv.relation] = by_relation.get(inv.relation, 0) + 1
    detail = ", ".join(f"{n} {r}" for r, n in sorted(by_relation.items())) or "none"
    print(f"inferred {len(invariants)} invariants ({detail}) from {len(args.trace_dirs)} trace(s), "
          f"{inferencer.windows} step windows, {report.events} events -> {args.output}")
    return 0
