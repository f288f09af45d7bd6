"""`trainwatch report TRACE_DIR [-i INVARIANTS.json] -o REPORT.html`.

The check of `trainwatch check` with the page as the product: per-step loss, gradient
norm and update ratio with the violated steps marked, which rank disagreed on a
violated cross-rank rule, and for a clean run what was checked.  The verdict and the
exit codes are check's (0 no violation, 1 violations, 2 bad usage, unreadable input,
an unwritable page or nothing to judge); the page is written whatever the verdict.
"""

from __future__ import annotations

import argparse

from .check import check_traces


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace_dir", metavar="TRACE_DIR", help="directory of *.twtrace files (from `trainwatch collect`)")
    parser.add_argument("-i", "--invariants", metavar="INVARIANTS.json",
                        help="invariant file (default: the shipped curated set)")
    parser.add_argument("-o", "--output", metavar="REPORT.html", required=True,
                        help="where to write the self-contained HTML page")


def run(args: argparse.Namespace) -> int:
    return check_traces(args.trace_dir, args.invariants, command="report", report_html=args.output,
                        announce_html=True)
