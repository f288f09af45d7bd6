"""The Faust app: step windows over the events topic, trend monitors over step summaries.

Data flow inside one worker::

    events ─┐                         ┌─▶ violations (keyed by run)
            ├─▶ check-windows agent ──┼─▶ step-summaries (keyed by run) ─▶ trend agent ─▶ violations
    window-ticks ┘   (windows table)  └─▶ dead-letter

* Batches arrive keyed ``run:step``, so every rank's batches of one step meet on one
  partition and in one worker.  The ``windows`` table (changelogged) holds a
  `WindowRecord` per open window; the engine decides completeness and evaluates.
* Faust only allows table writes while handling a message of the table's partition,
  and a window whose last rank never reports gets no further messages.  So the
  worker's timer does not close windows itself: it sends a *tick* keyed like the
  window to the internal ``window-ticks`` topic, on the window's partition, and the
  same agent (which consumes both topics) closes it there.  That keeps every state
  change inside the partition's ordered stream — the property recovery relies on.
* A closed window stays in the table as a marker holding the ids of the violations it
  emitted, so a batch replayed after a crash is recognised and a window is never
  evaluated (and reported) twice.  Markers are evicted after a retention period.
* Step summaries are re-keyed by run so that one trend monitor sees a run's whole
  sequence; its state lives in the ``trends`` table.

No relation logic and no window decision lives here: `windows.WindowLifecycle` decides
what happens to a window, the engine (through `EnginePort`) says what is wrong, and
this module moves records between them and the topics.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
import time
from typing import Any, Callable, TextIO

import msgpack

from invariants.events import PRODUCER_STATS_META, SchemaError
from invariants.step_summary import StepSummary
from invariants.trends import TrendRules

from .broker_health import PROBE_INTERVAL_S, BrokerHealth
from .config import CheckerConfig
from .dead_letter import dead_letter_record
from .engine_port import EnginePort
from .faust_app import build_faust_app
from .faust_compat.commit_gates import CommitGates
from .faust_compat.input_order import InputOrder
from .faust_compat.stall_guard import StallGuard
from .metrics import CheckerMetrics
from .report import encode_violation, violation_line
from .trend_state import TrendStates, apply_lifecycle
from .windows.lifecycle import Fold, WindowLifecycle
from .windows.record import WindowRecord

log = logging.getLogger("trainwatch.checker")

YIELD_EVERY_MESSAGES = 64
DELIVERY_WAIT_S = 5.0
#: Every this many ticks the timer re-reads the whole table and looks for evictions.
RESCAN_EVERY_TICKS = 20
#: Every this many ticks input partitions are checked for a stalled fetch (`StallGuard`).
STALL_CHECK_EVERY_TICKS = 8


class StreamChecker:
    """Agents, tables and timer of one checker worker, around a `WindowLifecycle`."""

    def __init__(
        self,
        config: CheckerConfig,
        engine: EnginePort,
        metrics: CheckerMetrics,
        *,
        trend_rules: TrendRules | None = None,
        out: TextIO | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.engine = engine
        self.metrics = metrics
        self.out = out or sys.stdout
        self.clock = clock
        self.app = build_faust_app(config)
        names = config.topics
        self.names = names
        raw = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw", "value_serializer": "raw"}
        n = config.partitions
        self.input_topic = self.app.topic(names.events, names.window_ticks, partitions=n, **raw)
        self.ticks_topic = self.app.topic(names.window_ticks, partitions=n, **raw)
        self.summaries_topic = self.app.topic(names.step_summaries, partitions=n, **raw)
        self.violations_topic = self.app.topic(names.violations, **raw)
        self.dead_letter_topic = self.app.topic(names.dead_letter, **raw)
        table = {"partitions": n, "key_type": bytes, "value_type": bytes}  # bytes -> raw codec
        self.windows = self.app.Table("windows", default=None, **table)
        self.run_states = self.app.Table("run-states", default=None, **table)
        self.lifecycle = WindowLifecycle(
            engine, self.windows, self.run_states, events_topic=names.events, grace_seconds=config.grace_seconds,
            closed_retention_seconds=config.closed_retention_seconds, clock=clock,
        )
        self.trends = TrendStates(self.app.Table("trends", default=None, **table), trend_rules or TrendRules())
        #: events partition -> offset of the last batch read (for the lag gauges)
        self._positions: dict[int, int] = {}
        self._ticks = 0
        # Records lost between Faust's fetcher and the agent are read again (`input_order`),
        # and no offset commit passes a record the agent has not handled, nor the first
        # batch of a window not written to its table yet.
        probe = getattr(self.app.transport, "highwater_probe", None)
        self._input_order = InputOrder(self.app, (names.events, names.window_ticks, names.step_summaries), probe)
        if hasattr(self.app.transport, "commit_gate"):
            self.app.transport.commit_gate = CommitGates(self._input_order, self.lifecycle.pending)
        self._stall_guard = StallGuard(self.app, self._input_order, probe)
        self.broker = BrokerHealth.of_app(self.app, config.bootstrap_servers)
        metrics.broker_up.set(1)
        self.app.timer(PROBE_INTERVAL_S)(self._probe_broker)
        self.app.agent(self.input_topic, name=f"{config.app_id}.check-windows")(self._check_windows)
        self.app.agent(self.summaries_topic, name=f"{config.app_id}.trend-monitors")(self._monitor_trends)
        self.app.timer(config.tick_interval_seconds)(self._tick)

    # ------------------------------------------------------------------ agents
    async def _check_windows(self, stream: Any) -> None:
        handled = 0
        async for event in stream.events():
            handled += 1
            if handled % YIELD_EVERY_MESSAGES == 0:
                # A full stream buffer never suspends the agent; without this the grace
                # timer (and the lag gauges) would starve under sustained load.
                await asyncio.sleep(0)
            message = event.message
            order = self._input_order
            if not order.in_order(message.tp, message.offset, message.generation_id) \
                    and not await order.admit(message.tp, message.offset, message.generation_id):
                continue  # a record before it was lost on the way; it is being read again
            try:
                if message.topic == self.names.window_ticks:
                    closing = self.lifecycle.on_tick(message.key, message.value, message.partition,
                                                     message.generation_id)
                    if closing is not None:
                        await self._close(message.key, *closing, forced=True)
                else:
                    self._positions[message.partition] = message.offset
                    self.lifecycle.partition_read(message.partition,
                                                  float(message.timestamp) if message.timestamp else None)
                    await self._on_batch(message)
                self.lifecycle.persist_due(message.partition, message.generation_id)
            except Exception as exc:  # a bug must cost one message, not the worker
                log.exception("failed to process %s[%s]@%s", message.topic, message.partition, message.offset)
                await self._dead_letter(message, "internal_error", f"{type(exc).__name__}: {exc}")

    async def _on_batch(self, message: Any) -> None:
        payload = message.value if message.value is not None else b""
        try:
            batch = self.engine.decode(payload, self.config.max_batch_bytes)
        except SchemaError as exc:
            await self._dead_letter(message, exc.reason, str(exc))
            return
        producer_ts = float(message.timestamp) if message.timestamp else None
        folded = self.lifecycle.fold(batch, partition=message.partition, offset=message.offset,
                                     generation=message.generation_id, producer_ts=producer_ts)
        if folded.outcome is Fold.DUPLICATE:
            return  # redelivered after a restart or takeover: already folded (or judged)
        self.metrics.batch_consumed(batch.run, len(batch.events), producer_ts)
        self._observe_meta(batch.run, batch.rank, batch.events)
        if folded.outcome is Fold.LATE:
            self.metrics.late_batch(batch.run)
        elif folded.outcome is Fold.REJECTED:
            error = folded.error
            log.error("engine rejected a batch of run %s step %s: %r", batch.run, batch.step, error)
            await self._dead_letter(message, "rejected", f"{type(error).__name__}: {error}")
        elif folded.outcome is Fold.COMPLETE:
            await self._close(folded.key, folded.record, folded.window, forced=False)

    def _observe_meta(self, run: str, rank: int, events: list[Any]) -> None:
        """Producer counters to the metrics."""
        if events:
            # events are in emission order: the last one is the producer's newest
            self.metrics.event_time(run, events[-1].t)
        for event in events:
            if event.KIND == "meta" and event.what == PRODUCER_STATS_META:
                self.metrics.producer_stats(run, (rank, event.pid), event.stats())

    # ------------------------------------------------------------------ windows
    async def _close(self, key: bytes, record: WindowRecord, window: Any, *, forced: bool) -> None:
        verdict = self.lifecycle.evaluate(record, window, forced=forced)
        deliveries = [
            await self.violations_topic.send(key=record.run.encode(), value=encode_violation(violation))
            for violation in verdict.fresh
        ]
        # Delivered before the closed marker is written: a crash in between can at worst
        # repeat a violation (same id, dropped by readers), never lose one.
        await self._settle(deliveries, "violation delivery")
        # Queued, not awaited: the producer's buffer sends it before the closed marker
        # queued below (both go out in order), and the agent does not wait a broker round
        # trip per step for a record of the run's one summaries partition.
        self.summaries_topic.send_soon(key=record.run.encode(), value=verdict.summary_payload)
        self.lifecycle.mark_closed(key, record, verdict)
        if verdict.fresh:
            # Flush the marker too, so a crash from here on cannot repeat the violations.
            await self._settle([self.app.producer.flush()], "producer flush")
        self.metrics.window_closed(record.run, record.step, missing_ranks=verdict.missing_ranks,
                                   missing_workers=verdict.missing_workers, seconds=verdict.seconds)
        coverage_line = self.metrics.coverage.window_closed(verdict.coverage)
        for violation in verdict.fresh:
            self._report(violation)
        if coverage_line:
            print(coverage_line, file=self.out, flush=True)

    async def _settle(self, waits: list[Any], what: str) -> None:
        """Wait for deliveries, but never indefinitely.

        During a rebalance Faust suspends the flow of the worker while it waits for
        the agents to go idle; an agent blocked on a delivery would then stall its
        partitions.  After `DELIVERY_WAIT_S` the agent moves on (the records stay
        queued in the producer and go out when the flow resumes).
        """
        if not waits:
            return
        try:
            await asyncio.wait_for(asyncio.gather(*waits), timeout=DELIVERY_WAIT_S)
        except asyncio.TimeoutError:
            log.warning("%s still pending after %ss; continuing", what, DELIVERY_WAIT_S)

    def _report(self, violation: dict[str, Any], *, invariant: bool = True) -> None:
        if invariant:  # trend alerts have their own counter, trainwatch_trend_alerts_total
            self.metrics.violation(
                str(violation.get("run")), str(violation.get("relation")), str(violation.get("invariant")),
                int(violation.get("step") or 0),
            )
        print(violation_line(violation), file=self.out, flush=True)

    async def _dead_letter(self, message: Any, reason: str, error: str) -> None:
        record = dead_letter_record(message, reason, error, checker=self.config.app_id, at=self.clock()).to_dict()
        self.metrics.dead_letter(reason)
        await self.dead_letter_topic.send(
            key=message.key, value=msgpack.packb(record, use_bin_type=True),
            headers=[("trainwatch-reason", reason.encode())],
        )

    # ------------------------------------------------------------------ trends
    async def _monitor_trends(self, stream: Any) -> None:
        async for event in stream.events():
            message = event.message
            order = self._input_order  # summaries are dropped on the way like batches
            if not order.in_order(message.tp, message.offset, message.generation_id) \
                    and not await order.admit(message.tp, message.offset, message.generation_id):
                continue
            try:
                envelope = msgpack.unpackb(message.value, raw=False)
                summary = StepSummary.from_dict(envelope["summary"])
            except Exception as exc:
                await self._dead_letter(message, "bad_summary", f"{type(exc).__name__}: {exc}")
                continue
            monitor, live = self.trends.get(summary.run)
            lifecycle = envelope.get("lifecycle") or ()
            if apply_lifecycle(live, lifecycle):
                self.metrics.run_liveness(summary.run, bool(live))
            alerts = monitor.observe(summary)
            deliveries = [
                await self.violations_topic.send(key=summary.run.encode(), value=encode_violation(alert.to_violation_dict()))
                for alert in alerts
            ]
            await self._settle(deliveries, "trend alert delivery")  # as for violations
            # Steps that raised an alert are always persisted (so a replay cannot repeat it).
            self.trends.put(summary.run, monitor, live, must=bool(alerts or lifecycle))
            if alerts:
                await self._settle([self.app.producer.flush()], "producer flush")
            for alert in alerts:
                self.metrics.trend_alert(alert.run, alert.rule)
                self._report(alert.to_violation_dict(), invariant=False)

    # ------------------------------------------------------------------ timer
    async def _tick(self) -> None:
        now = self.clock()
        self._ticks += 1
        rescan = self._ticks % RESCAN_EVERY_TICKS == 1
        if rescan:
            self.lifecycle.rescan(self._owned_partitions())
            self.metrics.forget_expired_runs()  # bounds the run label: series of ended/idle runs go
        for request in self.lifecycle.requests(now, evictions=rescan):
            await self.ticks_topic.send(key=request.key, value=request.op, partition=request.partition)
        self.metrics.open_windows.set(self.lifecycle.open_count)
        self._update_consumer_lag()
        await self._input_order.retry_repairs()
        if self._ticks % STALL_CHECK_EVERY_TICKS == 0 and self.broker.up:
            await self._stall_guard.check()  # its fetch probe would only wait out a dead broker

    async def _probe_broker(self) -> None:
        up = await self.broker.probe()
        self.metrics.broker_up.set(1 if up else 0)
        if not up:
            self._update_consumer_lag()

    def _owned_partitions(self) -> set[int] | None:
        try:
            return {tp.partition for tp in self.app.consumer.assignment() if tp.topic == self.names.events}
        except Exception:
            return None

    def _update_consumer_lag(self) -> None:
        if not self.broker.up:
            # The assignment and high-watermarks are what the consumer saw before the
            # broker went away: reporting them would say "caught up" about a worker
            # that reads nothing.  It owns no partition it can read, and its lag is
            # unknown (NaN, which no lag alert compares true with) until the broker answers.
            self.metrics.assigned_partitions.set(0)
            for partition in self._positions:
                self.metrics.consumer_lag.labels(partition=str(partition)).set(math.nan)
            return
        consumer = self.app.consumer
        try:
            assignment = consumer.assignment()
        except Exception:
            return
        owned = [tp for tp in assignment if tp.topic == self.names.events]
        self.metrics.assigned_partitions.set(len(owned))
        for partition in set(self._positions) - {tp.partition for tp in owned}:
            # moved to another worker on a rebalance: its lag is that worker's to report
            self._positions.pop(partition, None)
            self.lifecycle.partition_gone(partition)
            try:
                self.metrics.consumer_lag.remove(str(partition))
            except KeyError:
                pass
        for tp in owned:
            position = self._positions.get(tp.partition)
            try:
                highwater = consumer.highwater(tp)
            except Exception:
                continue
            if highwater is None or position is None:
                continue
            lag = max(0, highwater - position - 1)
            self.lifecycle.partition_lag(tp.partition, lag)
            self.metrics.consumer_lag.labels(partition=str(tp.partition)).set(lag)
