"""The checker's Prometheus metrics (docs/design.md, "Metrics") on an explicit `CollectorRegistry`.

Metric names and labels are a contract with the alert rules and Grafana dashboards in
``deploy/``; every one is documented in docs/design.md, "Metrics".  Labels stay
bounded: run, relation, invariant, reason, partition, rule — never a step or a tensor
name (per-violation detail goes to the violations topic).  The number of runs is
bounded too: a run's series are removed after it ended or went idle, see
`stream_checkers.run_retention`.

Producers report *cumulative* drop counts in ``producer_stats`` meta events; this
module turns them into counter increments per producer, so a restarted producer (whose
count starts again at zero) neither subtracts nor double counts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from trainwatch_version import version

from .coverage_metrics import CoverageMetrics
from .run_retention import RunRetention


@dataclass
class CumulativeToIncrements:
    """Per-source last seen value of a monotonically growing count."""

    _last: dict[Hashable, int] = field(default_factory=dict)

    def increment(self, source: Hashable, cumulative: int) -> int:
        previous = self._last.get(source, 0)
        self._last[source] = cumulative
        if cumulative < previous:  # the source restarted and counts from zero again
            return cumulative
        return cumulative - previous

    def forget_run(self, run: str) -> None:
        """Drop the sources of one run (keys are ``(run, producer)``)."""
        for source in [s for s in self._last if isinstance(s, tuple) and s and s[0] == run]:
            del self._last[source]


class CheckerMetrics:
    """All metrics of one checker process, registered on the registry it is given."""

    def __init__(self, registry: CollectorRegistry, retention: RunRetention | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry
        self.retention = retention if retention is not None else RunRetention()
        self._clock = clock
        self.violations = Counter(
            "trainwatch_violations", "Invariant and trend violations reported.",
            ["run", "relation", "invariant"], registry=registry,
        )
        self.first_violation_step = Gauge(
            "trainwatch_first_violation_step", "Lowest step with a violation in this run.",
            ["run"], registry=registry,
        )
        self.steps_checked = Counter(
            "trainwatch_steps_checked", "Step windows closed and evaluated.", ["run"], registry=registry
        )
        self.last_checked_step = Gauge(
            "trainwatch_last_checked_step", "Highest step evaluated so far.", ["run"], registry=registry
        )
        self.events_consumed = Counter(
            "trainwatch_events_consumed", "Events in consumed, well-formed batches.", ["run"], registry=registry
        )
        self.batches_consumed = Counter(
            "trainwatch_batches_consumed", "Well-formed batches consumed.", ["run"], registry=registry
        )
        self.dead_letters = Counter(
            "trainwatch_dead_letters", "Messages routed to the dead-letter topic.", ["reason"], registry=registry
        )
        self.late_batches = Counter(
            "trainwatch_late_batches", "Batches that arrived after their step window closed.",
            ["run"], registry=registry,
        )
        self.missing_rank_windows = Counter(
            "trainwatch_missing_rank_windows", "Step windows closed by the grace timer with ranks missing.",
            ["run"], registry=registry,
        )
        self.missing_worker_windows = Counter(
            "trainwatch_missing_worker_windows",
            "Step windows closed by the grace timer while DataLoader workers a rank announced had not reported.",
            ["run"], registry=registry,
        )
        self.window_evaluation = Histogram(
            "trainwatch_window_evaluation_seconds", "Time to evaluate one closed step window.",
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=registry,
        )
        self.open_windows = Gauge(
            "trainwatch_open_windows", "Step windows currently open on this worker.", registry=registry
        )
        self.checker_lag = Gauge(
            "trainwatch_checker_lag_seconds",
            "Now minus the producer timestamp of the last consumed batch.", registry=registry,
        )
        self.consumer_lag = Gauge(
            "trainwatch_consumer_lag_messages",
            "Events-topic messages not yet processed (fetch high-watermark minus position; NaN while the broker is down).",
            ["partition"], registry=registry,
        )
        self.assigned_partitions = Gauge(
            "trainwatch_assigned_partitions",
            "Events-topic partitions this worker currently owns and can read (0 while the broker is down).",
            registry=registry,
        )
        self.broker_up = Gauge(
            "trainwatch_broker_up",
            "1 while the Kafka cluster answers this worker's metadata probe, 0 while it does not.",
            registry=registry,
        )
        self.producer_dropped_events = Counter(
            "trainwatch_producer_dropped_events", "Events producers dropped before reaching Kafka.",
            ["run"], registry=registry,
        )
        self.producer_dropped_batches = Counter(
            "trainwatch_producer_dropped_batches", "Batches producers dropped before reaching Kafka.",
            ["run"], registry=registry,
        )
        self.producer_overhead_share = Gauge(
            "trainwatch_producer_overhead_share",
            "Largest share of step time a producer of the run measured for itself (producers under an overhead "
            "budget report it).", ["run"], registry=registry,
        )
        self.run_live = Gauge(
            "trainwatch_run_live", "1 between a run's run_start and run_end announcements.",
            ["run"], registry=registry,
        )
        self.last_event_timestamp = Gauge(
            "trainwatch_last_event_timestamp_seconds", "Wall-clock time of the newest event seen.",
            ["run"], registry=registry,
        )
        self.trend_alerts = Counter(
            "trainwatch_trend_alerts", "Trend-monitor alerts (NaN loss, spikes, plateaus, gradients...).",
            ["run", "rule"], registry=registry,
        )
        self.build_info = Gauge(
            "trainwatch_build_info", "Always 1; the label carries the checker version.",
            ["version"], registry=registry,
        )
        self.build_info.labels(version=version()).set(1)
        self.coverage = CoverageMetrics(registry)
        self._dropped_events = CumulativeToIncrements()
        self._dropped_batches = CumulativeToIncrements()
        self._overhead_shares: dict[str, dict[Hashable, float]] = {}  # run -> producer -> latest share
        self._first_violation: dict[str, int] = {}
        self._last_checked: dict[str, int] = {}
        self._last_event_ns: dict[str, int] = {}
        self._violation_labels: dict[str, set[tuple[str, str]]] = {}
        self._trend_rules: dict[str, set[str]] = {}
        #: Series labelled by run alone; removed together when the run is forgotten.
        self._per_run = (
            self.first_violation_step, self.steps_checked, self.last_checked_step, self.events_consumed,
            self.batches_consumed, self.late_batches, self.missing_rank_windows, self.missing_worker_windows,
            self.producer_dropped_events, self.producer_dropped_batches, self.run_live, self.last_event_timestamp,
            self.producer_overhead_share,
        )
        #: Counters that start at 0 the moment a run is first seen: a series born at 1
        #: has no earlier sample, so ``increase()`` over it is empty until a second
        #: event, and the dashboard panel and alert miss the first late batch or drop.
        self._zeroed_per_run = (
            self.steps_checked, self.events_consumed, self.batches_consumed, self.late_batches,
            self.missing_rank_windows, self.missing_worker_windows, self.producer_dropped_events,
            self.producer_dropped_batches,
        )

    # -- bounded run label -------------------------------------------------------------
    def _touch(self, run: str) -> None:
        first_seen = run not in self.retention
        for evicted in self.retention.touch(run, self._clock()):
            self._forget(evicted)
        if first_seen:
            for counter in self._zeroed_per_run:
                counter.labels(run=run)

    def forget_expired_runs(self) -> int:
        """Remove the series of runs past their retention; returns how many runs went."""
        expired = self.retention.expired(self._clock())
        for run in expired:
            self._forget(run)
        return len(expired)

    def _forget(self, run: str) -> None:
        for metric in self._per_run:
            try:
                metric.remove(run)
            except KeyError:  # this worker never set that series for the run
                pass
        for relation, invariant in self._violation_labels.pop(run, ()):
            self.violations.remove(run, relation, invariant)
        for rule in self._trend_rules.pop(run, ()):
            self.trend_alerts.remove(run, rule)
        for per_run in (self._first_violation, self._last_checked, self._last_event_ns, self._overhead_shares):
            per_run.pop(run, None)
        self._dropped_events.forget_run(run)
        self._dropped_batches.forget_run(run)

    # -- consumption -------------------------------------------------------------------
    def batch_consumed(self, run: str, events: int, producer_timestamp_s: float | None) -> None:
        self._touch(run)
        self.batches_consumed.labels(run=run).inc()
        self.events_consumed.labels(run=run).inc(events)
        if producer_timestamp_s:
            self.checker_lag.set(max(0.0, time.time() - producer_timestamp_s))

    def event_time(self, run: str, newest_ns: int) -> None:
        self._touch(run)
        if newest_ns > self._last_event_ns.get(run, 0):
            self._last_event_ns[run] = newest_ns
            self.last_event_timestamp.labels(run=run).set(newest_ns / 1e9)

    def producer_stats(self, run: str, producer: Hashable, stats: dict[str, Any]) -> None:
        self._touch(run)
        dropped_events = stats.get("dropped_events")
        if isinstance(dropped_events, int) and not isinstance(dropped_events, bool):
            self.producer_dropped_events.labels(run=run).inc(
                self._dropped_events.increment((run, producer), dropped_events)
            )
        dropped_batches = stats.get("dropped_batches")
        if isinstance(dropped_batches, int) and not isinstance(dropped_batches, bool):
            self.producer_dropped_batches.labels(run=run).inc(
                self._dropped_batches.increment((run, producer), dropped_batches)
            )
        share = stats.get("overhead_share")
        if isinstance(share, (int, float)) and not isinstance(share, bool) and 0 <= share < float("inf"):
            shares = self._overhead_shares.setdefault(run, {})
            shares[producer] = float(share)
            self.producer_overhead_share.labels(run=run).set(max(shares.values()))

    def dead_letter(self, reason: str) -> None:
        self.dead_letters.labels(reason=reason).inc()

    def late_batch(self, run: str) -> None:
        self._touch(run)
        self.late_batches.labels(run=run).inc()

    # -- windows -----------------------------------------------------------------------
    def window_closed(self, run: str, step: int, *, missing_ranks: bool, seconds: float,
                      missing_workers: bool = False) -> None:
        self._touch(run)
        self.window_evaluation.observe(seconds)
        self.steps_checked.labels(run=run).inc()
        if step > self._last_checked.get(run, -1):
            self._last_checked[run] = step
            self.last_checked_step.labels(run=run).set(step)
        if missing_ranks:
            self.missing_rank_windows.labels(run=run).inc()
        if missing_workers:
            self.missing_worker_windows.labels(run=run).inc()

    def violation(self, run: str, relation: str, invariant: str, step: int) -> None:
        self._touch(run)
        self._violation_labels.setdefault(run, set()).add((relation, invariant))
        self.violations.labels(run=run, relation=relation, invariant=invariant).inc()
        if step < self._first_violation.get(run, step + 1):
            self._first_violation[run] = step
            self.first_violation_step.labels(run=run).set(step)

    def trend_alert(self, run: str, rule: str) -> None:
        self._touch(run)
        self._trend_rules.setdefault(run, set()).add(rule)
        self.trend_alerts.labels(run=run, rule=rule).inc()

    def run_liveness(self, run: str, live: bool) -> None:
        self._touch(run)
        self.retention.set_ended(run, not live, self._clock())
        self.run_live.labels(run=run).set(1 if live else 0)


def start_metrics_server(registry: CollectorRegistry, host: str, port: int) -> Any:
    """Serve /metrics on host:port (loopback by default); returns the server to shut down."""
    from prometheus_client import start_http_server

    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server
