"""Run one checker worker in this process: topics, metrics endpoint, Faust worker.

Used by ``trainwatch serve`` (and, through a child ``serve`` process, by ``watch``).
The Faust worker is started programmatically, so the process is an ordinary command
with our flags, exit codes and signal handling rather than Faust's own CLI.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

from prometheus_client import CollectorRegistry

from .config import CheckerConfig
from .engine_port import EnginePort
from .metrics import CheckerMetrics, start_metrics_server
from .topics import ensure_topics

SWITCH_INTERVAL_S = 0.0005


def run_worker(config: CheckerConfig, engine: EnginePort, *, out: TextIO | None = None) -> int:
    """Block until the worker is stopped (SIGINT/SIGTERM); return a process exit code."""
    import faust  # noqa: F401  (heavy import kept out of module import time)

    from .app import StreamChecker

    out = out or sys.stdout
    # Faust runs its Kafka consumer in a second thread.  Every socket send of the
    # main loop releases the GIL and then waits out the busy consumer thread's switch
    # interval (5 ms by default) to get it back; a short interval keeps produce calls
    # from queueing behind fetch decoding.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    ensure_topics(config, timeout_s=config.connect_timeout_seconds)
    registry = CollectorRegistry()
    metrics = CheckerMetrics(registry)
    server = start_metrics_server(registry, config.metrics_host, config.metrics_port)
    try:
        checker = StreamChecker(config, engine, metrics, out=out)
        host, port = server.server_address[:2]
        print(
            f"trainwatch serve: checking {config.topics.events} on {config.bootstrap} "
            f"({config.partitions} partitions, grace {config.grace_seconds:g}s); "
            f"metrics on http://{host}:{port}/metrics",
            file=out,
            flush=True,
        )
        worker = faust.Worker(
            checker.app,
            loglevel=config.log_level,
            quiet=True,
            redirect_stdouts=False,
            override_logging=True,
        )
        worker.spinner = None  # terminal control codes have no place in a log
        logging.getLogger("trainwatch.checker").setLevel(logging.INFO)
        try:
            worker.execute_from_commandline()
        except SystemExit as exc:
            return int(exc.code or 0) if isinstance(exc.code, int) else 0
        return 0
    finally:
        server.shutdown()
