"""Producer settings, read from ``TRAINWATCH_*`` environment variables.

The launcher (`trainwatch collect`) talks to every process it starts only through the
environment, because that is the one channel that reaches torchrun workers,
``mp.spawn`` children and DataLoader workers alike.  This module does not import torch.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping

from invariants.events import DEFAULT_TOPIC_PREFIX, EVENTS_TOPIC

from .selection import Selection, default_selection, load_selection

ENV_RUN_ID = "TRAINWATCH_RUN_ID"
ENV_TRACE_DIR = "TRAINWATCH_TRACE_DIR"
ENV_BOOTSTRAP = "TRAINWATCH_BOOTSTRAP"
ENV_INVARIANTS = "TRAINWATCH_INVARIANTS"
ENV_SAMPLE_EVERY = "TRAINWATCH_SAMPLE_EVERY"
ENV_OVERHEAD_BUDGET = "TRAINWATCH_OVERHEAD_BUDGET"
ENV_FULL = "TRAINWATCH_FULL"
ENV_TOPIC_PREFIX = "TRAINWATCH_TOPIC_PREFIX"
ENV_FLUSH_TIMEOUT = "TRAINWATCH_FLUSH_TIMEOUT"
ENV_STATS_DIR = "TRAINWATCH_STATS_DIR"
ENV_QUEUE_MAX = "TRAINWATCH_QUEUE_MAX"
ENV_ENABLED = "TRAINWATCH_ENABLE"
ENV_QUIET = "TRAINWATCH_QUIET"


def make_run_id(hint: str | None = None) -> str:
    """A readable, unique run id: ``<hint>-<utc time>-<random>``."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(hint).stem if hint else "run").strip("-") or "run"
    return f"{stem}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"


def parse_overhead_budget(value: str | float | None) -> float | None:
    """A share of each step's wall time (``0.05`` = 5 %), from the command line, the
    environment or the Python API; None when unset."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        budget = float(value)
    except ValueError:
        raise ValueError(f"overhead budget {value!r} is not a number (a share of step time, e.g. 0.05)") from None
    if not 0 < budget < 1:
        raise ValueError(f"overhead budget {value!r} must be between 0 and 1 (0.05 = 5 % of each step)")
    return budget


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class ProducerConfig:
    run_id: str
    trace_dir: str | None = None
    bootstrap: str | None = None
    selection: Selection = default_selection()
    sample_every: int = 1
    #: share of step time the producer may take; it thins snapshots to stay within it
    overhead_budget: float | None = None
    topic_prefix: str = DEFAULT_TOPIC_PREFIX
    flush_timeout_s: float = 5.0
    stats_dir: str | None = None
    queue_max: int = 2048
    quiet: bool = False

    @property
    def events_topic(self) -> str:
        return f"{self.topic_prefix}{EVENTS_TOPIC}"

    def with_defaults(self) -> "ProducerConfig":
        """No sink configured at all means: trace files under ./traces/<run>."""
        if self.trace_dir is None and self.bootstrap is None:
            return replace(self, trace_dir=str(Path("traces") / self.run_id))
        return self

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "ProducerConfig":
        environ = os.environ if environ is None else environ
        full = _truthy(environ.get(ENV_FULL))
        invariants = environ.get(ENV_INVARIANTS)
        selection = load_selection(invariants, full=full) if invariants else default_selection(full)
        return cls(
            run_id=environ.get(ENV_RUN_ID) or make_run_id(),
            trace_dir=environ.get(ENV_TRACE_DIR) or None,
            bootstrap=environ.get(ENV_BOOTSTRAP) or None,
            selection=selection,
            sample_every=max(int(environ.get(ENV_SAMPLE_EVERY) or 1), 1),
            overhead_budget=parse_overhead_budget(environ.get(ENV_OVERHEAD_BUDGET)),
            topic_prefix=environ.get(ENV_TOPIC_PREFIX) or DEFAULT_TOPIC_PREFIX,
            flush_timeout_s=float(environ.get(ENV_FLUSH_TIMEOUT) or 5.0),
            stats_dir=environ.get(ENV_STATS_DIR) or None,
            queue_max=max(int(environ.get(ENV_QUEUE_MAX) or 2048), 1),
            quiet=_truthy(environ.get(ENV_QUIET)),
        ).with_defaults()

    def to_env(self) -> dict[str, str]:
        """The environment a child process needs to build the same config."""
        env = {
            ENV_ENABLED: "1",
            ENV_RUN_ID: self.run_id,
            ENV_SAMPLE_EVERY: str(self.sample_every),
            ENV_TOPIC_PREFIX: self.topic_prefix,
            ENV_FLUSH_TIMEOUT: str(self.flush_timeout_s),
            ENV_QUEUE_MAX: str(self.queue_max),
        }
        if self.overhead_budget is not None:
            env[ENV_OVERHEAD_BUDGET] = repr(self.overhead_budget)
        if self.trace_dir:
            env[ENV_TRACE_DIR] = str(Path(self.trace_dir).resolve())
        if self.bootstrap:
            env[ENV_BOOTSTRAP] = self.bootstrap
        if self.selection.source not in ("default", "full"):
            env[ENV_INVARIANTS] = str(Path(self.selection.source).resolve())
        if self.selection.full:
            env[ENV_FULL] = "1"
        if self.stats_dir:
            env[ENV_STATS_DIR] = self.stats_dir
        if self.quiet:
            env[ENV_QUIET] = "1"
        return env
