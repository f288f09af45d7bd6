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

No relation logic lives here: the engine (through `EnginePort`) says what is wrong.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TextIO

import faust
import msgpack

from invariants.events import SchemaError
from invariants.step_summary import StepSummary, StepSummaryBuilder
from invariants.trends import TrendMonitor, TrendRules

from .broker_health import PROBE_INTERVAL_S, BrokerHealth
from .config import CheckerConfig
from .dead_letter import dead_letter_record
from .faust_compat.commit_gates import CommitGates
from .faust_compat.input_order import InputOrder
from .faust_compat.stall_guard import StallGuard
from .faust_compat.transport import FetchHighwaterProbe, HighwaterTransport
from .engine_port import EnginePort
from .metrics import CheckerMetrics
from .report import encode_violation, violation_line
from .windows.grace import grace_expired
from .windows.pending import PendingWindows
from .windows.record import WindowRecord, window_key

log = logging.getLogger("trainwatch.checker")

TICK_RESEND_SECONDS = 2.0
YIELD_EVERY_MESSAGES = 64
DELIVERY_WAIT_S = 5.0
#: Every this many ticks the timer re-reads the whole table and looks for evictions.
RESCAN_EVERY_TICKS = 20
#: Every this many ticks input partitions are checked for a stalled fetch (`StallGuard`).
STALL_CHECK_EVERY_TICKS = 8
#: Changelog writes of per-run bookkeeping are thinned out; see `_close` and the trend agent.
RUN_STATE_WRITE_EVERY = 16
TREND_WRITE_EVERY = 8


def build_faust_app(config: CheckerConfig) -> faust.App:
    """A Faust app configured for short-lived loopback brokers as well as real clusters."""
    security = config.security
    credentials: Any = None
    if security.protocol.startswith("SASL"):
        credentials = faust.SASLCredentials(
            username=security.username,
            password=security.password,
            ssl_context=security.ssl_context(),
            mechanism=security.sasl_mechanism or "PLAIN",
        )
    elif security.protocol == "SSL":
        credentials = faust.SSLCredentials(security.ssl_context())
    session = config.session_timeout_seconds
    app = faust.App(
        config.app_id,
        broker=[f"kafka://{server}" for server in config.bootstrap_servers],
        broker_credentials=credentials,
        store="memory://",
        datadir=config.data_dir,
        autodiscover=False,
        web_enabled=False,
        topic_partitions=config.partitions,
        topic_replication_factor=1,
        table_standby_replicas=0,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=session,
        broker_heartbeat_interval=max(0.5, session / 6),
        broker_rebalance_timeout=max(session * 2, 10.0),
        broker_commit_interval=1.0,
        worker_redirect_stdouts=False,
        consumer_max_fetch_size=max(config.max_batch_bytes + 1024, 1024 * 1024),
        producer_max_request_size=max(config.max_batch_bytes + 1024, 1024 * 1024),
        # One record per produce batch: brokers such as tansu otherwise hand back only
        # part of a multi-record batch when a changelog is replayed (DESIGN §7).
        producer_max_batch_size=1 if config.single_record_batches else 16384,
    )
    # Table recovery must read each changelog to its true end; see `end_offsets`.
    app.transport = HighwaterTransport(
        app.conf.broker_consumer, app,
        highwater_probe=FetchHighwaterProbe(config.bootstrap_servers, config.security.kafka_python_kwargs()),
    )
    return app


@dataclass
class _Cache:
    """Decoded window records, valid while the table still holds the bytes we wrote."""

    entries: dict[bytes, tuple[bytes, WindowRecord, Any]] = field(default_factory=dict)

    def get(self, key: bytes, raw: bytes | None) -> tuple[WindowRecord, Any] | None:
        entry = self.entries.get(key)
        if entry is not None and raw is not None and entry[0] is raw:
            return entry[1], entry[2]
        return None

    def put(self, key: bytes, raw: bytes, record: WindowRecord, window: Any) -> None:
        self.entries[key] = (raw, record, window)

    def drop(self, key: bytes) -> None:
        self.entries.pop(key, None)


class StreamChecker:
    """Agents, tables and timer of one checker worker, around an `EnginePort`."""

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
        self.trend_rules = trend_rules or TrendRules()
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
        self.trends = self.app.Table("trends", default=None, **table)
        self._cache = _Cache()
        self._ticks_sent: dict[bytes, float] = {}
        self._positions: dict[int, int] = {}
        #: events partition -> unread records (from the last lag update) and newest producer time read
        self._lags: dict[int, int] = {}
        self._event_times: dict[int, float] = {}
        self._trend_cache: dict[bytes, tuple[bytes, TrendMonitor, set[int]]] = {}
        self._run_cache: dict[bytes, tuple[bytes, Any]] = {}
        self._write_counts: dict[bytes, int] = {}
        #: In-process index of the table for the timer: key -> (last batch time, partition,
        #: newest producer time) of open windows, (close time, partition) of closed ones.
        #: Rebuilt from the table now and then to pick up restored windows.
        self._open: dict[bytes, tuple[float, int, float]] = {}
        self._closed: dict[bytes, tuple[float, int]] = {}
        self._ticks = 0
        # Records lost between Faust's fetcher and the agent are read again (`input_order`),
        # and no offset commit passes a record the agent has not handled.
        probe = getattr(self.app.transport, "highwater_probe", None)
        self._input_order = InputOrder(self.app, (names.events, names.window_ticks, names.step_summaries), probe)
        #: open windows not written to the table yet; they hold back offset commits
        self._pending = PendingWindows(names.events)
        if hasattr(self.app.transport, "commit_gate"):
            self.app.transport.commit_gate = CommitGates(self._input_order, self._pending)
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
                    await self._on_tick(message)
                else:
                    self._positions[message.partition] = message.offset
                    if message.timestamp:
                        seen = self._event_times.get(message.partition, 0.0)
                        self._event_times[message.partition] = max(seen, float(message.timestamp))
                    await self._on_batch(message)
                self._persist_due(message.partition, message.generation_id)
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
        run, step, rank, seq = batch.run, batch.step, batch.rank, batch.seq
        events = batch.events
        pid = batch.pid
        if not isinstance(pid, int) or isinstance(pid, bool):
            pid = events[0].pid if events else 0
        key = window_key(run, step)
        raw = self.windows.get(key)
        record, window = self._current(key, raw, message)
        if record is not None and record.has_seen(rank, pid, seq):
            return  # redelivered after a restart or takeover: already folded (or judged)
        producer_ts = float(message.timestamp) if message.timestamp else None
        self.metrics.batch_consumed(run, len(events), producer_ts)
        lifecycle = self._observe_meta(run, rank, events)
        now = self.clock()
        if record is None:
            _, run_state = self._run_state(run, message.partition)
            if self.engine.is_closed(run_state, step):
                self.metrics.late_batch(run)  # its closed marker was already evicted
                return
            window = self.engine.open(run, step)
            record = WindowRecord(run, step, message.partition, now, now, builder=StepSummaryBuilder(run, step))
        if record.closed:
            self.metrics.late_batch(run)
            return
        try:
            self.engine.add(window, batch)
        except Exception as exc:
            log.exception("engine rejected a batch of run %s step %s", run, step)
            await self._dead_letter(message, "rejected", f"{type(exc).__name__}: {exc}")
            return
        record.summary_builder().add_batch(batch)
        record.seen.append([rank, pid, seq])
        record.last_batch_at = now
        if producer_ts:
            record.newest_producer_ts = max(record.newest_producer_ts, producer_ts)
        record.lifecycle.extend([rank, what] for what in lifecycle)
        if self.engine.complete(window):
            await self._close(key, record, window, forced=False)
        else:  # written to the table only if it stays open a while (`pending_windows`)
            self._pending.hold(key, record, window, message.partition, message.offset, now,
                               message.generation_id, raw)
            self._index(key, record)

    def _observe_meta(self, run: str, rank: int, events: list[Any]) -> list[str]:
        """Producer counters to the metrics; returns the batch's run_start/run_end marks."""
        if events:
            # events are in emission order: the last one is the producer's newest
            self.metrics.event_time(run, events[-1].t)
        lifecycle = []
        for event in events:
            if event.KIND != "meta":
                continue
            if event.what == "producer_stats":
                self.metrics.producer_stats(run, (rank, event.pid), event.stats())
            elif event.what in ("run_start", "run_end"):
                lifecycle.append(event.what)
        return lifecycle

    async def _on_tick(self, message: Any) -> None:
        key = message.key
        op = message.value
        raw = self.windows.get(key)
        record, window = self._current(key, raw, message)
        if record is None:
            return
        now = self.clock()
        if op == b"close" and not record.closed and self._grace_expired(
                now, record.last_batch_at, record.newest_producer_ts, record.partition):
            await self._close(key, record, window, forced=True)
        elif op == b"evict" and record.closed and now - record.closed_at >= self.config.closed_retention_seconds:
            del self.windows[key]
            self._forget(key)

    def _forget(self, key: bytes) -> None:
        self._cache.drop(key)
        self._ticks_sent.pop(key, None)
        self._open.pop(key, None)
        self._closed.pop(key, None)

    # ------------------------------------------------------------------ windows
    def _current(self, key: bytes, raw: bytes | None, message: Any) -> tuple[WindowRecord | None, Any]:
        """The window as this worker knows it: newer in memory than in the table, or from the table."""
        pending = self._pending.get(key, message.partition, message.generation_id, raw)
        if pending is not None:
            return pending.record, pending.window
        return self._load(key, raw)

    def _persist_due(self, partition: int, generation: Any) -> None:
        """Write the partition's windows that stayed open a while (table writes are only
        allowed while a message of the table's partition is being handled)."""
        for entry in self._pending.due(partition, self.clock(), generation):
            self._store(entry.key, entry.record, entry.window)

    def _load(self, key: bytes, raw: bytes | None) -> tuple[WindowRecord | None, Any]:
        if raw is None:
            return None, None
        cached = self._cache.get(key, raw)
        if cached is not None:
            return cached
        record = WindowRecord.from_bytes(raw)
        window = self.engine.load_window(record.engine_state) if record.engine_state is not None else None
        self._cache.put(key, raw, record, window)
        return record, window

    def _store(self, key: bytes, record: WindowRecord, window: Any) -> None:
        record.engine_state = self.engine.dump_window(window) if window is not None else None
        raw = record.to_bytes()
        self.windows[key] = raw
        self._cache.put(key, raw, record, window)
        self._pending.release(key, record.partition)
        self._index(key, record)

    def _index(self, key: bytes, record: WindowRecord) -> None:
        if record.closed:
            self._open.pop(key, None)
            self._closed[key] = (record.closed_at or 0.0, record.partition)
        else:
            self._open[key] = (record.last_batch_at, record.partition, record.newest_producer_ts)

    def _run_state(self, run: str, partition: int) -> tuple[bytes, Any]:
        # Steps of one run are spread over partitions; each partition keeps its own
        # run state so that it moves with the partition on a rebalance.
        key = f"{run}\x00{partition}".encode()
        raw = self.run_states.get(key)
        cached = self._run_cache.get(key)
        if cached is not None and raw is not None and cached[0] is raw:
            return key, cached[1]
        return key, (self.engine.load_run_state(raw) if raw is not None else self.engine.new_run_state(run))

    async def _close(self, key: bytes, record: WindowRecord, window: Any, *, forced: bool) -> None:
        started = time.perf_counter()
        # a forced close is about missing ranks, or only about DataLoader workers that never reported
        missing_ranks = forced and bool(self.engine.missing_ranks(window))
        missing_workers = forced and self.engine.missing_workers(window) > 0
        run_key, run_state = self._run_state(record.run, record.partition)
        coverage = self.engine.coverage(window)
        violations = self.engine.evaluate(window, run_state)
        elapsed = time.perf_counter() - started
        self.engine.compact_run_state(run_state)
        if self._due(run_key, RUN_STATE_WRITE_EVERY):
            # The run state is bookkeeping (late answers after marker eviction); the
            # window markers carry what recovery needs, so it is persisted every few closes.
            raw_run_state = self.engine.dump_run_state(run_state)
            self.run_states[run_key] = raw_run_state
            self._run_cache[run_key] = (raw_run_state, run_state)
        fresh = [v for v in violations if v.get("id") not in record.emitted]
        deliveries = [
            await self.violations_topic.send(key=record.run.encode(), value=encode_violation(violation))
            for violation in fresh
        ]
        # Delivered before the closed marker is written: a crash in between can at worst
        # repeat a violation (same id, dropped by readers), never lose one.
        await self._settle(deliveries, "violation delivery")
        summary = record.summary_builder()
        # Queued, not awaited: the producer's buffer sends it before the closed marker
        # queued below (both go out in order), and the agent does not wait a broker round
        # trip per step for a record of the run's one summaries partition.
        self.summaries_topic.send_soon(
            key=record.run.encode(),
            value=msgpack.packb({"summary": summary.summary().to_dict(), "lifecycle": record.lifecycle}),
        )
        record.emitted.extend(v["id"] for v in fresh)
        record.closed_at = self.clock()
        record.summary = None
        record.builder = None
        self._store(key, record, None)
        self._ticks_sent.pop(key, None)
        if fresh:
            # Flush the marker too, so a crash from here on cannot repeat the violations.
            await self._settle([self.app.producer.flush()], "producer flush")
        self.metrics.window_closed(record.run, record.step, missing_ranks=missing_ranks,
                                   missing_workers=missing_workers, seconds=elapsed)
        coverage_line = self.metrics.coverage.window_closed(coverage)
        for violation in fresh:
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
            key = summary.run.encode()
            monitor, live = self._trend_state(key, summary.run)
            live = self._run_liveness(summary.run, live, envelope.get("lifecycle") or ())
            alerts = monitor.observe(summary)
            deliveries = [
                await self.violations_topic.send(key=key, value=encode_violation(alert.to_violation_dict()))
                for alert in alerts
            ]
            await self._settle(deliveries, "trend alert delivery")  # as for violations
            if alerts or envelope.get("lifecycle") or self._due(b"trend\x00" + key, TREND_WRITE_EVERY):
                # Steps that raised an alert are always persisted (so a replay cannot
                # repeat it); quiet steps only every few, to spare changelog records.
                raw = msgpack.packb({"monitor": monitor.to_dict(), "live": sorted(live)})
                self.trends[key] = raw
                self._trend_cache[key] = (raw, monitor, live)
            if alerts:
                await self._settle([self.app.producer.flush()], "producer flush")
            for alert in alerts:
                self.metrics.trend_alert(alert.run, alert.rule)
                self._report(alert.to_violation_dict(), invariant=False)

    def _due(self, key: bytes, every: int) -> bool:
        """True on the first and then every ``every``-th call for ``key``."""
        count = self._write_counts.get(key, 0)
        self._write_counts[key] = count + 1
        return count % every == 0

    def _trend_state(self, key: bytes, run: str) -> tuple[TrendMonitor, set[int]]:
        """The run's monitor, decoded only when the table holds bytes we did not write."""
        raw = self.trends.get(key)
        cached = self._trend_cache.get(key)
        if cached is not None and raw is not None and cached[0] is raw:
            return cached[1], cached[2]
        state = msgpack.unpackb(raw, raw=False) if raw is not None else {}
        if "monitor" in state:
            return TrendMonitor.from_dict(state["monitor"], self.trend_rules), set(state.get("live", ()))
        return TrendMonitor(run, self.trend_rules), set()

    def _run_liveness(self, run: str, live: set[int], lifecycle: Any) -> set[int]:
        """Ranks between run_start and run_end; the run is live while any rank is.

        Lifecycle events ride on step summaries because those are keyed by run: the
        one worker that owns a run's summaries owns its liveness gauge.
        """
        if not lifecycle:
            return live
        for rank, what in lifecycle:
            if what == "run_start":
                live.add(int(rank))
            elif what == "run_end":
                live.discard(int(rank))
        self.metrics.run_liveness(run, bool(live))
        return live

    # ------------------------------------------------------------------ timer
    async def _tick(self) -> None:
        now = self.clock()
        self._ticks += 1
        if self._ticks % RESCAN_EVERY_TICKS == 1:
            self._rescan()
        for key, (last_batch_at, partition, newest_producer_ts) in list(self._open.items()):
            if self._grace_expired(now, last_batch_at, newest_producer_ts, partition):
                await self._request(key, partition, b"close", now)
        if self._ticks % RESCAN_EVERY_TICKS == 1:
            self.metrics.forget_expired_runs()  # bounds the run label: series of ended/idle runs go
            retention = self.config.closed_retention_seconds
            for key, (closed_at, partition) in list(self._closed.items()):
                if now - closed_at >= retention:
                    await self._request(key, partition, b"evict", now)
        self.metrics.open_windows.set(len(self._open))
        self._update_consumer_lag()
        await self._input_order.retry_repairs()
        if self._ticks % STALL_CHECK_EVERY_TICKS == 0 and self.broker.up:
            await self._stall_guard.check()  # its fetch probe would only wait out a dead broker

    async def _probe_broker(self) -> None:
        up = await self.broker.probe()
        self.metrics.broker_up.set(1 if up else 0)
        if not up:
            self._update_consumer_lag()

    def _grace_expired(self, now: float, last_batch_at: float, newest_producer_ts: float, partition: int) -> bool:
        return grace_expired(now=now, last_batch_at=last_batch_at, newest_producer_ts=newest_producer_ts,
                             grace=self.config.grace_seconds, partition_lag=self._lags.get(partition),
                             partition_event_time=self._event_times.get(partition))

    def _rescan(self) -> None:
        """Rebuild the timer's index from the table (restored or revoked partitions)."""
        try:
            owned = {tp.partition for tp in self.app.consumer.assignment() if tp.topic == self.names.events}
        except Exception:
            owned = None
        if owned is not None:
            self._pending.keep_only(owned)
        present = set()
        for entry in self._pending.entries():
            present.add(entry.key)
            self._index(entry.key, entry.record)
        for key, raw in list(self.windows.items()):
            if key in present:
                continue
            try:
                record, _ = self._load(key, raw)
            except Exception:
                continue
            if record is not None:
                present.add(key)
                self._index(key, record)
        for key in (set(self._open) | set(self._closed) | set(self._cache.entries)) - present:
            self._forget(key)

    async def _request(self, key: bytes, partition: int, op: bytes, now: float) -> None:
        if now - self._ticks_sent.get(key, -math.inf) < TICK_RESEND_SECONDS:
            return
        self._ticks_sent[key] = now
        await self.ticks_topic.send(key=key, value=op, partition=partition)

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
            self._lags.pop(partition, None)
            self._event_times.pop(partition, None)
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
            self._lags[tp.partition] = lag
            self.metrics.consumer_lag.labels(partition=str(tp.partition)).set(lag)
