"""`trainwatch watch`: run a training command and check it live on one machine.

Without ``--bootstrap`` an embedded Kafka-protocol broker is started on a free
loopback port; a checker worker (``trainwatch serve``) and its metrics endpoint come
up next to it, the command runs under ``trainwatch collect``, and violations are
printed as they are found.  Exit codes follow ``check``: 0 no violation, 1 invariant
violations, 2 bad usage, infrastructure failure, or a training command that failed
without a violation being found.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from invariants.events import DEFAULT_TOPIC_PREFIX
from stream_checkers.config import DEFAULT_GRACE_SECONDS

EXIT_USAGE = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = "trainwatch watch [options] -- CMD..."
    parser.add_argument("-i", "--invariants", default=None, help="invariant file (default: the shipped set)")
    parser.add_argument("--bootstrap", default=os.environ.get("TRAINWATCH_BOOTSTRAP"),
                        help="use this Kafka cluster instead of an embedded broker")
    parser.add_argument("--metrics-port", type=int, default=0,
                        help="port of the checker's /metrics on 127.0.0.1 (default: a free port)")
    parser.add_argument("-o", "--output", dest="trace_dir", default=None,
                        help="also keep trace files in this directory")
    parser.add_argument("--run-id", default=None, help="run identifier (default: <script>-<time>-<random>)")
    parser.add_argument("--grace-seconds", type=float, default=DEFAULT_GRACE_SECONDS,
                        help="wait this long after a step window's last batch for ranks that have not "
                             f"reported the step (default {DEFAULT_GRACE_SECONDS:g})")
    parser.add_argument("--drain-timeout", type=float, default=60.0,
                        help="after the command exits, wait at most this long for the checker (default 60)")
    parser.add_argument("--every-violation", action="store_true",
                        help="print every violation as it arrives (default: the first of each invariant in full, "
                             "then reminders at 2, 4, 8, ... violating steps, and a roll-up at the end)")
    parser.add_argument("--topic-prefix", default=os.environ.get("TRAINWATCH_TOPIC_PREFIX", DEFAULT_TOPIC_PREFIX),
                        help="Kafka topic prefix (default: $TRAINWATCH_TOPIC_PREFIX, else trainwatch.)")


def _run_id(command: list[str]) -> str:
    from producers.config import make_run_id

    hint = next((os.path.splitext(os.path.basename(a))[0] for a in command if a.endswith(".py")),
                os.path.basename(command[0]))
    return make_run_id(hint)


def run(args: argparse.Namespace) -> int:
    command = args.cmd or []
    if not command:
        print("trainwatch watch: error: no command given (usage: trainwatch watch [options] -- CMD...)",
              file=sys.stderr)
        return EXIT_USAGE
    if args.invariants and not os.path.isfile(args.invariants):
        print(f"trainwatch watch: error: invariant file {args.invariants} does not exist", file=sys.stderr)
        return EXIT_USAGE
    from stream_checkers.embedded_broker import BrokerUnavailable, find_tansu
    from stream_checkers.console.watch_session import WatchOptions, WatchSession

    if not args.bootstrap:
        try:
            find_tansu()
        except BrokerUnavailable as exc:
            print(f"trainwatch watch: {exc}", file=sys.stderr)
            return EXIT_USAGE
        _drop_cluster_security_settings()
    options = WatchOptions(
        command=command,
        run_id=args.run_id or _run_id(command),
        bootstrap=args.bootstrap,
        invariants=os.path.abspath(args.invariants) if args.invariants else None,
        metrics_port=args.metrics_port,
        trace_dir=args.trace_dir,
        grace_seconds=args.grace_seconds,
        topic_prefix=args.topic_prefix,
        drain_timeout_s=args.drain_timeout,
        fold_repeats=not args.every_violation,
    )
    # SIGTERM (a CI timeout, a job scheduler) gets the same orderly teardown as Ctrl-C.
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        return WatchSession(options).run()
    finally:
        signal.signal(signal.SIGTERM, previous)


def _drop_cluster_security_settings() -> None:
    """The embedded broker is plaintext on loopback: SSL/SASL variables exported for a
    cluster would make the checker and the producers fail against it, so this process
    and its children (checker, collect) run without them."""
    names = sorted(name for name in os.environ if name.startswith("TRAINWATCH_KAFKA_"))
    if names:
        print(f"trainwatch watch: ignoring {', '.join(names)}: the embedded broker is plaintext on loopback "
              "(use --bootstrap for a secured cluster)", file=sys.stderr)
    for name in names:
        del os.environ[name]


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
