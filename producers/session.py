"""A producer session: sinks + tracer + installed hooks, from start to the final flush.

The same machinery serves the launcher (installed from the environment when the
training process imports torch) and the Python API (`producers.instrument`).
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from invariants.events import RUN_START_META
from trainwatch_version import version

from . import runtime
from .config import ProducerConfig, parse_overhead_budget
from .interception import install
from .recorder import StepRecorder
from .redaction import recorded_argv
from .sampling import sampling_note
from .signals import TermHandle, flush_on_sigterm
from .sinks import FileSink, KafkaSink, Sink, kafka_settings_from_env
from .tracer import Tracer


def detect_rank(environ: Any = None) -> tuple[int, int]:
    """Rank and world size: an initialised process group wins, then launcher variables."""
    environ = os.environ if environ is None else environ
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    try:
        world = int(environ.get("WORLD_SIZE", "1"))
        rank = int(environ.get("RANK", environ.get("LOCAL_RANK", "0")))
    except ValueError:
        return 0, 1
    world = max(world, 1)
    return (rank, world) if 0 <= rank < world else (0, world)


class Session:
    """One process's instrumentation.  ``close()`` removes every hook and flushes."""

    def __init__(self, config: ProducerConfig, *, close_at_exit: bool = False) -> None:
        self.config = config
        self.forked_child = False
        self._closed = False
        self._close_lock = threading.Lock()
        rank, world = detect_rank()
        self.sinks: list[Sink] = []
        self.file_sink: FileSink | None = None
        self.kafka_sink: KafkaSink | None = None
        if config.trace_dir:
            self.file_sink = FileSink(config.trace_dir)
            self.sinks.append(self.file_sink)
        if config.bootstrap:
            self.kafka_sink = KafkaSink(
                config.bootstrap,
                config.events_topic,
                settings=kafka_settings_from_env(),
                queue_max=config.queue_max,
                on_client_created=self._run_close_first if close_at_exit else None,
            )
            self.sinks.append(self.kafka_sink)
        self.recorder = StepRecorder(config.run_id, rank, world, self.sinks)
        self.tracer = Tracer(
            self.recorder,
            config.selection,
            sample_every=config.sample_every,
            overhead_budget=config.overhead_budget,
            stats_source=self.delivery_stats,
        )
        self.tracer.record_meta(RUN_START_META, **self._run_metadata())
        runtime.activate(self)
        try:
            self._handles = install(self.tracer, config.selection, self._update_rank)
        except BaseException:
            runtime.deactivate(self)
            raise
        self._term_handle: TermHandle | None = None
        if close_at_exit:
            runtime.register_exit(self.close)
            # torchrun/Kubernetes stop workers with SIGTERM, which skips atexit.
            self._term_handle = flush_on_sigterm(self.close, self.recorder.gate)

    # -- public API -----------------------------------------------------------------
    @property
    def run_id(self) -> str:
        return self.config.run_id

    def stage(self, name: str) -> Any:
        """Context manager: events inside are tagged with stage ``name``."""
        return self.tracer.explicit_stage(name)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def delivery_stats(self) -> dict[str, int]:
        totals = {"sent_batches": 0, "sent_events": 0, "dropped_batches": 0, "dropped_events": 0}
        # Kafka is the lossy channel; with files only, report the file sink.
        sink = self.kafka_sink or self.file_sink
        if sink is not None:
            totals.update(sink.stats().as_dict())
        return totals

    def close(self) -> None:
        """Remove hooks, end the open step, deliver within the flush timeout, report."""
        with self.recorder.gate:  # a SIGTERM meanwhile chains on once the close is done
            self._close()

    def _close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        if self._term_handle is not None:
            self._term_handle.remove()
            self._term_handle = None
        if self.forked_child:
            self.close_worker()
            return
        self.tracer.enabled = False
        for handle in reversed(self._handles):
            try:
                handle.remove()
            except Exception as exc:
                self.tracer.internal_error("removing hooks", exc)
        self._handles = []
        try:
            self.tracer.finish({"internal_errors": self.tracer.internal_errors,
                                "left_out_calls": self.tracer.left_out.count,
                                "separate_models": self.tracer.replicas.separate_models()})
        except Exception as exc:
            self.tracer.internal_error("final flush", exc)
        self.recorder.close_sinks(self.config.flush_timeout_s)
        runtime.deactivate(self)
        if self.tracer.active:
            self._write_stats()
            if not self.config.quiet:
                print(self.summary_line(), file=sys.stderr)

    # -- process life cycle ---------------------------------------------------------
    def on_fork_child(self) -> None:
        self.forked_child = True
        self.tracer.reset_after_fork()

    def close_worker(self) -> None:
        """End of a DataLoader worker: deliver its one batch, no summary."""
        self.tracer.enabled = False
        self.recorder.close_sinks(min(self.config.flush_timeout_s, 1.0))
        if self.recorder.counters.batches:
            self._write_stats(role="worker")

    def _run_close_first(self) -> None:
        # kafka-python registers its own exit handler when a client is created; ours
        # must run before it so the final batch is still delivered.
        runtime.register_exit(self.close)

    def _update_rank(self) -> None:
        rank, world = detect_rank()
        self.recorder.rank, self.recorder.world = rank, world

    # -- reporting ------------------------------------------------------------------
    def _run_metadata(self) -> dict[str, Any]:
        return {
            "versions": {
                "trainwatch": version(),
                "torch": torch.__version__,
                "python": platform.python_version(),
            },
            "argv": recorded_argv(sys.argv),  # secrets redacted unless opted in
            "host": socket.gethostname(),
            "local_rank": os.environ.get("LOCAL_RANK"),
            "config": {
                "sample_every": self.config.sample_every,
                "overhead_budget": self.config.overhead_budget,
                "selection": self.config.selection.source,
                "full": self.config.selection.full,
                "sinks": [sink.name for sink in self.sinks],
            },
        }

    def stats(self) -> dict[str, Any]:
        counters = self.recorder.counters
        kafka = self.kafka_sink
        return {
            "run": self.config.run_id,
            "rank": self.recorder.rank,
            "world": self.recorder.world,
            "pid": os.getpid(),
            "steps": self.tracer.training_steps,
            "events": counters.events,
            "batches": counters.batches,
            "internal_errors": self.tracer.internal_errors,
            "left_out_calls": self.tracer.left_out.count,
            "trace_file": str(self.file_sink.path) if self.file_sink and self.file_sink.path else None,
            "trace_error": self.file_sink.error if self.file_sink else None,
            "sinks": {sink.name: sink.stats().as_dict() for sink in self.sinks},
            "kafka_error": kafka.last_error if kafka is not None else None,
            "sampling": self.tracer.sampler.report(),
        }

    def _write_stats(self, role: str = "trainer") -> None:
        if not self.config.stats_dir:
            return
        try:
            directory = Path(self.config.stats_dir)
            directory.mkdir(parents=True, exist_ok=True)
            (directory / f"{os.getpid()}.json").write_text(json.dumps({**self.stats(), "role": role}))
        except OSError as exc:
            self.tracer.internal_error("writing stats", exc)

    def summary_line(self) -> str:
        s = self.stats()
        parts = [
            f"trainwatch: run {s['run']} rank {s['rank']}/{s['world']} pid {s['pid']}: "
            f"{s['steps']} steps, {s['events']} events in {s['batches']} batches"
        ]
        if s["trace_file"]:
            parts.append(f"trace {s['trace_file']}")
        if s["trace_error"]:
            parts.append(f"trace FAILED ({s['trace_error']})")
        kafka = s["sinks"].get("kafka")
        if kafka is not None:
            parts.append(
                f"kafka sent {kafka['sent_batches']} batches, dropped {kafka['dropped_batches']} "
                f"batches ({kafka['dropped_events']} events)"
            )
        if s["internal_errors"]:
            parts.append(f"{s['internal_errors']} internal errors")
        if s["left_out_calls"]:
            parts.append(f"{s['left_out_calls']} optimizer/clipping calls of a trainer pass without backward not recorded")
        sampling = sampling_note(s["sampling"])
        if sampling:
            parts.append(sampling)
        return "; ".join(parts)


@contextmanager
def instrument(
    run_id: str | None = None,
    trace_dir: str | os.PathLike[str] | None = None,
    bootstrap: str | None = None,
    selection: Any = None,
    sample_every: int = 1,
    quiet: bool = False,
    overhead_budget: float | None = None,
) -> Iterator[Session]:
    """Instrument the training code in the ``with`` block; see `producers` for details."""
    from .config import make_run_id
    from .selection import Selection, default_selection, load_selection

    existing = runtime.active_session()
    if existing is not None:  # already instrumented (e.g. under `trainwatch collect`)
        yield existing
        return
    if selection is None:
        chosen = default_selection()
    elif isinstance(selection, Selection):
        chosen = selection
    elif isinstance(selection, (str, os.PathLike)):
        chosen = load_selection(selection)
    else:
        chosen = Selection(apis=frozenset(selection), source="api")
    config = ProducerConfig(
        run_id=run_id or make_run_id(sys.argv[0] if sys.argv and sys.argv[0] else None),
        trace_dir=str(trace_dir) if trace_dir is not None else None,
        bootstrap=bootstrap,
        selection=chosen,
        sample_every=sample_every,
        overhead_budget=parse_overhead_budget(overhead_budget),
        quiet=quiet,
    ).with_defaults()
    session = Session(config)
    try:
        yield session
    finally:
        session.close()
