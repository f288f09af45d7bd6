"""Run one checker worker in this process: topics, metrics endpoint, Faust worker.

Used by ``trainwatch serve`` (and, through a child ``serve`` process, by ``watch``).
The Faust worker is started programmatically, so the process is an ordinary command
with our flags, exit codes and signal handling rather than Faust's own CLI.
"""

from __future__ import annotations

import gc
import logging
import sys
from typing import TextIO

from prometheus_client import CollectorRegistry

from .config import CheckerConfig
from .engine_port import EnginePort
from .metrics import CheckerMetrics, start_metrics_server
from .topics import ensure_topics

SWITCH_INTERVAL_S = 0.0005
#: Young-generation threshold of the cyclic garbage collector in a worker (CPython's
#: default is 700 allocations).
GC_YOUNG_THRESHOLD = 50_000


def tune_gc_for_streaming() -> None:
    """Make the cyclic collector cheap for a process that decodes batches all day.

    Every decoded batch allocates thousands of small, acyclic dicts and lists (one
    per event and attribute map).  With the default threshold the collector runs
    several times per batch and each older-generation pass walks the whole heap of
    open windows, Faust and aiokafka objects: measured as a third of the agent's CPU.
    The heap built at start-up is frozen (never scanned again) and young collections
    run every 50k allocations instead of 700; reference counting still frees the
    batches themselves immediately, only cycles wait longer.
    """
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def run_worker(config: CheckerConfig, engine: EnginePort, *, out: TextIO | None = None) -> int:
    """Block until the worker is stopped (SIGINT/SIGTERM); return a process exit code:
    0 after a clean stop, 2 (`EXIT_UNCLEAN_STOP`) when the broker was unreachable as it
    stopped, so no final offset commit was made."""
    # Faust is a heavy import, kept out of module import time.
    from .app import StreamChecker
    from .bounded_worker import EXIT_UNCLEAN_STOP, BoundedShutdownWorker

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
        worker = BoundedShutdownWorker(
            checker.app,
            checker.broker,
            loglevel=config.log_level,
            quiet=True,
            redirect_stdouts=False,
            override_logging=True,
        )
        worker.spinner = None  # terminal control codes have no place in a log
        tune_gc_for_streaming()
        logging.getLogger("trainwatch.checker").setLevel(logging.INFO)
        code = 0
        try:
            worker.execute_from_commandline()
        except SystemExit as exc:
            code = int(exc.code or 0) if isinstance(exc.code, int) else 0
        if worker.stopped_with_broker_down:
            print(f"trainwatch serve: stopped with the broker at {config.bootstrap} unreachable: no final "
                  "offset commit; records consumed since the last commit are read again by the next worker",
                  file=sys.stderr, flush=True)
            return code or EXIT_UNCLEAN_STOP
        return code
    finally:
        server.shutdown()
