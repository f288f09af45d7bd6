"""`trainwatch collect`: run a training command unmodified, instrumenting every Python process.

    trainwatch collect [-o TRACE_DIR] [--bootstrap HOST:PORT] [--run-id ID]
                       [-i INVARIANTS] [--sample-every N] [--overhead-budget SHARE] [--full] -- CMD...

Traces go to TRACE_DIR and/or events stream to Kafka; with neither ``-o`` nor
``--bootstrap`` traces go to ``./traces/<run-id>``.  A TRACE_DIR that already holds
traces of another run is refused (exit 2): the runs would be mixed, in the report and
in `check`.  Pass that run's ``--run-id`` to add to it (a resumed run).  The command's
exit code is passed through; bad usage exits 2 with a one-line reason.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from dataclasses import replace
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Mapping

#: where `collect` writes how many batches its processes sent and dropped (set by `watch`)
ENV_DELIVERY_REPORT = "TRAINWATCH_DELIVERY_REPORT"

EXIT_USAGE = 2
_HOST_PORT = re.compile(r"^\[?[A-Za-z0-9_.:-]+\]?:\d{1,5}$")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = "trainwatch collect [options] -- CMD..."
    parser.add_argument("-o", "--output", dest="trace_dir", metavar="TRACE_DIR", help="write trace files here")
    parser.add_argument(
        "--bootstrap", metavar="HOST:PORT[,HOST:PORT]",
        help="stream events to this Kafka cluster (default: $TRAINWATCH_BOOTSTRAP)",
    )
    parser.add_argument(
        "--run-id", metavar="ID",
        help="run identifier (default: $TRAINWATCH_RUN_ID, else <script>-<time>-<random>)",
    )
    parser.add_argument(
        "-i", "--invariants", metavar="INVARIANTS",
        help="instrument only what these invariants need (invariants JSON, or a text file of API names)",
    )
    parser.add_argument("--sample-every", type=int, default=1, metavar="N", help="snapshot parameters every N steps")
    parser.add_argument("--overhead-budget", metavar="SHARE", default=None,
                        help="keep the producer within this share of each step's time (e.g. 0.05) by taking "
                             "parameter snapshots less often; the sampling is reported (default: every step)")
    parser.add_argument("--full", action="store_true", help="also record every torch function call (reference traces)")
    parser.add_argument("--topic-prefix", default=None, metavar="PREFIX", help="Kafka topic prefix (default: $TRAINWATCH_TOPIC_PREFIX, else trainwatch.)")
    parser.add_argument("--flush-timeout", type=float, default=5.0, metavar="SECONDS",
                        help="how long the exiting process may spend delivering pending events")


def _fail(message: str) -> int:
    print(f"trainwatch collect: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _script_hint(command: list[str]) -> str:
    for token in command[1:]:
        if token.endswith(".py"):
            return token
    return command[0]


def _broker_reachable(bootstrap: str, timeout_s: float = 1.0) -> bool:
    for server in bootstrap.split(","):
        host, _, port = server.strip().rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
                return True
        except (OSError, ValueError):
            continue
    return False


def _other_runs(trace_dir: str, run_id: str) -> str:
    """The runs other than ``run_id`` whose traces are already in ``trace_dir``, described."""
    from ..trace_runs import describe_runs, runs_in_trace_dir

    runs = runs_in_trace_dir(trace_dir)
    runs.pop(run_id, None)
    return describe_runs(runs) if runs else ""


def _with_env_defaults(args: argparse.Namespace, environ: Mapping[str, str]) -> argparse.Namespace:
    """Absent flags fall back to the ``TRAINWATCH_*`` variables a deployment already sets.

    A job template (Kubernetes, Slurm) usually exports the broker, run id and topic
    prefix once for every process; collect must honour them rather than overwrite them
    in the children's environment.  An explicit flag still wins.
    """
    from producers.config import ENV_BOOTSTRAP, ENV_RUN_ID, ENV_TOPIC_PREFIX

    return argparse.Namespace(**{
        **vars(args),
        "bootstrap": args.bootstrap or environ.get(ENV_BOOTSTRAP) or None,
        "run_id": args.run_id or environ.get(ENV_RUN_ID) or None,
        "topic_prefix": args.topic_prefix or environ.get(ENV_TOPIC_PREFIX) or None,
    })


def run(args: argparse.Namespace) -> int:
    from producers.config import DEFAULT_TOPIC_PREFIX, ProducerConfig, make_run_id, parse_overhead_budget
    from producers.launcher import LaunchError, check_trace_dir, run_instrumented
    from producers.report import collect_report, format_report
    from producers.selection import SelectionError, default_selection, load_selection

    args = _with_env_defaults(args, os.environ)
    command = list(args.cmd or [])
    if not command:
        return _fail("no training command given (usage: trainwatch collect [options] -- CMD...)")
    if args.sample_every < 1:
        return _fail("--sample-every must be at least 1")
    try:
        overhead_budget = parse_overhead_budget(args.overhead_budget)
    except ValueError as exc:
        return _fail(f"--overhead-budget: {exc}")
    if args.bootstrap and not all(_HOST_PORT.match(s.strip()) for s in args.bootstrap.split(",")):
        return _fail(f"--bootstrap (or $TRAINWATCH_BOOTSTRAP) {args.bootstrap!r} is not HOST:PORT")
    try:
        selection = load_selection(args.invariants, full=args.full) if args.invariants else default_selection(args.full)
    except SelectionError as exc:
        return _fail(str(exc))
    run_id = args.run_id or make_run_id(_script_hint(command))
    config = ProducerConfig(
        run_id=run_id,
        trace_dir=args.trace_dir,
        bootstrap=args.bootstrap,
        selection=selection,
        sample_every=args.sample_every,
        overhead_budget=overhead_budget,
        topic_prefix=args.topic_prefix or DEFAULT_TOPIC_PREFIX,
        flush_timeout_s=args.flush_timeout,
        quiet=True,  # collect prints one combined summary instead
    ).with_defaults()
    trace_dir = None
    if config.trace_dir:
        other_runs = _other_runs(config.trace_dir, run_id)
        if other_runs:
            return _fail(f"trace directory {config.trace_dir} already holds traces of {other_runs}; "
                         "use a new -o directory (or that run's --run-id to add to it)")
    try:
        if config.trace_dir:
            trace_dir = check_trace_dir(config.trace_dir)
    except LaunchError as exc:
        return _fail(str(exc))
    if config.bootstrap and not _broker_reachable(config.bootstrap):
        print(
            f"trainwatch collect: warning: Kafka at {config.bootstrap} is not reachable; "
            "events are dropped (and counted) until it is",
            file=sys.stderr,
        )
    stats_dir = Path(tempfile.mkdtemp(prefix="trainwatch-stats-"))
    try:
        config = replace(config, stats_dir=str(stats_dir))
        try:
            result = run_instrumented(command, config, stats_dir)
        except LaunchError as exc:
            return _fail(str(exc))
        report = collect_report(run_id, stats_dir, trace_dir)
        print(format_report(report, result.returncode, trace_dir, config.bootstrap, config.events_topic), file=sys.stderr)
        delivery_file = os.environ.get(ENV_DELIVERY_REPORT)
        if delivery_file:  # `watch` reads it: a verdict must not cover batches that never arrived
            Path(delivery_file).write_text(json.dumps({
                "batches": sum(p.batches for p in report.processes),
                "dropped_batches": report.total_dropped_batches,
            }))
        return result.returncode
    finally:
        shutil.rmtree(stats_dir, ignore_errors=True)
