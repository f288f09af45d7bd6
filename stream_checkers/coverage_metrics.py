"""What the streaming checker covered, per run: counters, a line at each run end, a read-back for `watch`.

"No violation" on a dashboard means nothing unless it says over how many training
iterations; a run that never trained, or whose ranks stopped reporting, must be told
apart from a clean one.  Counters carry the totals (labels ``run`` and ``reason``,
both bounded like every other label: a rank is never a label).  The per-rank view of
what this worker closed is logged when a window holds ranks' ``run_end``.
"""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

from invariants.coverage import MISSING_RANK, RunCoverage, WindowCoverage
from invariants.coverage_text import CoverageTotals, describe_run, rank_ranges

ITERATIONS = "trainwatch_iterations_checked"
SETUP_WINDOWS = "trainwatch_setup_windows_checked"
OPTIMIZER_STEPS = "trainwatch_optimizer_steps_checked"
UNCHECKED = "trainwatch_windows_unchecked"
RANKS = "trainwatch_run_ranks"


class CoverageMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.iterations = Counter(ITERATIONS, "Training iterations checked, summed over ranks.", ["run"],
                                  registry=registry)
        self.setup_windows = Counter(SETUP_WINDOWS, "Ranks whose setup window (before the first iteration) was checked.",
                                     ["run"], registry=registry)
        self.optimizer_steps = Counter(OPTIMIZER_STEPS, "Optimizer step calls in checked windows.", ["run"],
                                       registry=registry)
        self.unchecked = Counter(UNCHECKED, "Rank windows left unchecked, by reason (missing_rank: closed "
                                 "without that rank's step end).", ["run", "reason"], registry=registry)
        self.ranks = Gauge(RANKS, "World size the run's batches declare.", ["run"], registry=registry)
        #: this worker's per-rank view of runs still going (dropped once every rank ended)
        self._runs: dict[str, RunCoverage] = {}
        self._ended: dict[str, set[int]] = {}

    def window_closed(self, window: WindowCoverage) -> str | None:
        """Count a closed window; a line for the log when it holds ranks' run end."""
        run = window.run
        if window.iterations:
            self.iterations.labels(run=run).inc(window.iterations)
        if window.setup_windows:
            self.setup_windows.labels(run=run).inc(window.setup_windows)
        if window.optimizer_steps:
            self.optimizer_steps.labels(run=run).inc(window.optimizer_steps)
        if window.missing:
            self.unchecked.labels(run=run, reason=MISSING_RANK).inc(window.missing)
        coverage = self._runs.get(run)
        if coverage is None:
            coverage = self._runs[run] = RunCoverage(run)
        coverage.add(window)
        self.ranks.labels(run=run).set(coverage.world)
        ended = [part.rank for part in window.checked if part.reported is not None]
        if not ended:
            return None
        done = self._ended.setdefault(run, set())
        done.update(ended)
        if len(done) >= coverage.world:
            del self._runs[run], self._ended[run]
        return (f"coverage run={run}: {'rank' if len(ended) == 1 else 'ranks'} {rank_ranges(ended)} ended; "
                f"checked by this worker: {describe_run(coverage)}")


def totals_from_samples(samples: dict[str, float], run: str,
                        metric: Callable[..., float]) -> CoverageTotals:
    """A run's coverage as one worker's scraped ``/metrics`` report it (``metric`` sums samples)."""
    reasons: dict[str, int] = {}
    prefix = f"{UNCHECKED}_total{{"
    for key, value in samples.items():
        if key.startswith(prefix) and f'run="{run}"' in key and value:
            reason = key.split('reason="', 1)[1].split('"', 1)[0] if 'reason="' in key else "unknown"
            reasons[reason] = reasons.get(reason, 0) + int(value)
    return CoverageTotals(
        run=run,
        world=int(metric(samples, RANKS, run=run)),
        iterations=int(metric(samples, f"{ITERATIONS}_total", run=run)),
        setup_windows=int(metric(samples, f"{SETUP_WINDOWS}_total", run=run)),
        optimizer_steps=int(metric(samples, f"{OPTIMIZER_STEPS}_total", run=run)),
        unchecked_windows=reasons,
    )
