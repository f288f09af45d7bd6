"""The streaming checker checks runs: a real broker and real `trainwatch serve` workers
report divergence, missing ranks, NaN losses and hostile input, and close windows on time.

Runs are synthetic batches produced straight to Kafka (fast and deterministic); the
expected violations come from the offline engine (`StepWindows`) over the same
batches, so "equal to an uninterrupted run" is checked against one code path.
"""

from __future__ import annotations

import collections
import hashlib
import time

import msgpack

from invariants.codec import encode_batch
from invariants.events import make_batch
from stream_checkers.dead_letter import DEAD_LETTER_PREFIX_BYTES
from tests.support.kafka import (
    iter_violations,
    metric,
    produce,
    produce_raw,
    read_topic,
    synthetic_step_batch,
    wait_until,
)
from tests.support.stream_runs import DEAD_LETTER, EVENTS, VIOLATIONS
from tests.support.stream_runs import expected_ids as _expected_ids
from tests.support.stream_runs import invariant_violations as _invariant_violations
from tests.support.stream_runs import run_batches as _run_batches


def test_divergence_missing_rank_and_nan_loss_reported_once_with_metrics(kafka_broker, checker, pinned_invariants):
    worker = checker()
    # A DataLoader worker of rank 0 is its own producer: same rank and step, own pid, own
    # seq from 0; it must not be mistaken for a redelivery of the main process's batch.
    loader = make_batch(run="run-a", rank=0, world=2, step=0, seq=0, events=[
        {"kind": "meta", "t": 1, "pid": 2000, "tid": 1, "stage": "train", "what": "worker_start"}])
    loader["pid"] = 2000
    batches = [loader, *_run_batches("run-a", range(8), diverge_from=3, missing_rank1={6}, nan_loss_at=2)]
    expected = _expected_ids(batches, pinned_invariants)
    assert len(expected) >= 5  # steps 3..7 diverge (6 is also missing rank 1)
    produce(kafka_broker.bootstrap, EVENTS, batches)

    wait_until(lambda: {v["id"] for v in _invariant_violations(kafka_broker.bootstrap)} >= expected, 60,
               what="every expected violation on the violations topic")
    records = _invariant_violations(kafka_broker.bootstrap)
    ids = [v["id"] for v in records]
    assert sorted(ids) == sorted(expected)  # nothing extra, nothing twice
    first = min(records, key=lambda v: v["step"])
    assert first["step"] == 3 and first["relation"] == "Consistent" and first["run"] == "run-a"

    samples = wait_until(lambda: (m := worker.metrics()) and metric(m, "trainwatch_steps_checked_total", run="run-a") >= 8 and m,
                         30, what="all 8 steps checked in /metrics")
    assert metric(samples, "trainwatch_first_violation_step", run="run-a") == 3
    # steps 3, 4, 5 and 7 diverge; at step 6 rank 1 is missing, which is its own violation
    assert metric(samples, "trainwatch_violations_total", run="run-a", relation="Consistent") == 4
    assert metric(samples, "trainwatch_violations_total", run="run-a", relation="AllRanksReport") == 1
    assert metric(samples, "trainwatch_missing_rank_windows_total", run="run-a") == 1
    assert metric(samples, "trainwatch_batches_consumed_total", run="run-a") == len(batches)
    assert metric(samples, "trainwatch_events_consumed_total", run="run-a") == sum(len(b["events"]) for b in batches)
    assert metric(samples, "trainwatch_last_checked_step", run="run-a") == 7
    assert metric(samples, "trainwatch_window_evaluation_seconds_count") == 8
    assert metric(samples, "trainwatch_build_info") == 1

    trend = wait_until(lambda: [v for v in iter_violations(read_topic(kafka_broker.bootstrap, VIOLATIONS))
                                if v["relation"] == "Trend:nonfinite_loss"], 20, what="the NaN-loss trend alert")
    assert [(v["run"], v["step"]) for v in trend] == [("run-a", 2)]
    wait_until(lambda: metric(worker.metrics(), "trainwatch_trend_alerts_total", run="run-a", rule="nonfinite_loss") == 1,
               20, what="the trend alert counted (delivery comes first)")
    log = worker.log_text()
    assert "VIOLATION run=run-a step=3 ranks=0,1 [Consistent]" in log
    assert "[Trend:nonfinite_loss]" in log


def test_hostile_input_is_dead_lettered_and_counted_while_the_worker_keeps_checking(kafka_broker, checker):
    worker = checker(extra=["--max-batch-bytes", "65536"])
    good = synthetic_step_batch("run-h", 0, 1, 0)
    unknown_version = dict(good, v=99)
    wrong_type = dict(good, step="seven")
    missing_field = {k: v for k, v in good.items() if k != "world"}
    bad_event = make_batch(run="run-h", rank=0, world=1, step=1, seq=1, events=[{"kind": "telepathy", "t": 1, "pid": 1, "tid": 1, "stage": "train"}])
    huge = make_batch(run="run-h", rank=0, world=1, step=2, seq=2,
                      events=[{"kind": "meta", "t": 1, "pid": 1, "tid": 1, "stage": "train", "what": "x" * 200_000}])
    produce_raw(kafka_broker.bootstrap, EVENTS, [
        (b"run-h:0", b"\xc1\xff not msgpack at all"),
        (b"run-h:0", msgpack.packb([1, 2, 3])),
        (b"run-h:0", msgpack.packb(unknown_version)),
        (b"run-h:0", msgpack.packb(wrong_type)),
        (b"run-h:0", msgpack.packb(missing_field)),
        (b"run-h:1", msgpack.packb(bad_event)),
        (b"run-h:2", encode_batch(huge)),
        (None, b""),
    ])
    # a healthy single-rank run afterwards is still checked
    produce(kafka_broker.bootstrap, EVENTS, [synthetic_step_batch("run-ok", 0, 1, s) for s in range(3)])

    dead = wait_until(lambda: (r := read_topic(kafka_broker.bootstrap, DEAD_LETTER)) and len(r) >= 8 and r, 30,
                      what="eight dead-letter records")
    decoded = [msgpack.unpackb(r.value, raw=False) for r in dead]
    assert len(decoded) == 8
    reasons = collections.Counter(d["reason"] for d in decoded)
    assert reasons == {"undecodable": 2, "wrong_type": 2, "unknown_version": 1, "missing_field": 1,
                       "unknown_kind": 1, "oversized": 1}
    garbage = next(d for d in decoded if d["value"].startswith(b"\xc1\xff"))
    assert garbage["topic"] == EVENTS and garbage["key"] == b"run-h:0" and garbage["error"]
    oversized = next(d for d in decoded if d["reason"] == "oversized")
    assert oversized["value_size"] > 65536 and oversized["value_truncated"] is True
    # a short prefix and a digest, not a copy of what may be someone's data
    assert len(oversized["value"]) <= DEAD_LETTER_PREFIX_BYTES
    assert oversized["value_sha256"] == hashlib.sha256(encode_batch(huge)).hexdigest()

    samples = wait_until(lambda: (m := worker.metrics()) and metric(m, "trainwatch_steps_checked_total", run="run-ok") >= 3 and m,
                         30, what="the healthy run checked after the hostile input")
    for reason, count in reasons.items():
        assert metric(samples, "trainwatch_dead_letters_total", reason=reason) == count
    assert worker.proc.poll() is None
    assert not [v for v in _invariant_violations(kafka_broker.bootstrap) if v["run"] == "run-ok"]


def test_run_that_never_sends_rank_1_is_reported_per_step_after_the_grace_period(kafka_broker, checker):
    worker = checker()
    batches = [synthetic_step_batch("run-m", 0, 2, step) for step in range(3)]
    produce(kafka_broker.bootstrap, EVENTS, batches)
    records = wait_until(lambda: (v := _invariant_violations(kafka_broker.bootstrap)) and len(v) >= 3 and v, 30,
                         what="a missing-rank violation per step")
    assert sorted((v["step"], v["relation"], tuple(v["ranks"])) for v in records) == [
        (0, "AllRanksReport", (1,)), (1, "AllRanksReport", (1,)), (2, "AllRanksReport", (1,))]
    # violations are delivered before the close is counted (a crash in between can repeat
    # a violation, never lose one), so the counter may trail the topic briefly
    wait_until(lambda: metric(worker.metrics(), "trainwatch_missing_rank_windows_total", run="run-m") == 3, 20,
               what="the three grace-timer closes counted")
    # a batch for an already-closed window is late: counted, not re-evaluated
    produce(kafka_broker.bootstrap, EVENTS, [synthetic_step_batch("run-m", 1, 2, 0)])
    wait_until(lambda: metric(worker.metrics(), "trainwatch_late_batches_total", run="run-m") == 1, 20,
               what="the late batch counted")
    assert len(_invariant_violations(kafka_broker.bootstrap)) == 3


def test_a_dataloader_worker_that_never_reports_is_not_a_missing_rank(kafka_broker, checker):
    """Ranks announce the DataLoader workers they start; the window waits for their
    reports, and when the grace timer closes it without them, the close counts as
    missing workers, not as missing ranks, and no rank is reported missing."""
    worker = checker()
    announce = {"kind": "meta", "t": time.time_ns(), "pid": 100, "tid": 1, "stage": "train",
                "what": "dataloader_workers", "workers": 1}
    produce(kafka_broker.bootstrap, EVENTS,
            [synthetic_step_batch("run-w", rank, 2, 0, extra=[announce]) for rank in (0, 1)]
            + [synthetic_step_batch("run-w", rank, 2, 1) for rank in (0, 1)])
    samples = wait_until(lambda: (m := worker.metrics())
                         and metric(m, "trainwatch_missing_worker_windows_total", run="run-w") == 1
                         and metric(m, "trainwatch_steps_checked_total", run="run-w") == 2 and m, 30,
                         what="both windows closed, the one without its DataLoader workers by the grace timer")
    assert metric(samples, "trainwatch_missing_rank_windows_total", run="run-w") == 0
    assert not [v for v in _invariant_violations(kafka_broker.bootstrap) if v["relation"] == "AllRanksReport"]


def test_a_backlog_does_not_expire_windows_whose_batches_are_still_unread(kafka_broker, checker):
    """The grace period must not run out while the missing batch sits unread in the
    partition: a worker catching up on a backlog (after a restart, or when it falls
    behind) would otherwise report ranks as missing that did report."""
    from kafka import KafkaProducer

    from invariants.events import batch_key

    steps = 8000
    records = [synthetic_step_batch("run-g", 0, 2, 0)]
    records += [synthetic_step_batch("run-g", rank, 2, step) for step in range(1, steps) for rank in (0, 1)]
    records.append(synthetic_step_batch("run-g", 1, 2, 0))  # step 0's rank 1 comes last
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, linger_ms=20, batch_size=512 * 1024)
    sent_at = int(time.time() * 1000)  # one producer time: the run is a burst
    for batch in records:
        producer.send(EVENTS, key=batch_key(batch["run"], batch["step"]), value=encode_batch(batch),
                      timestamp_ms=sent_at, partition=0)  # one partition: the backlog is in front of rank 1
    producer.flush(timeout=60)
    producer.close()
    worker = checker()
    samples = wait_until(lambda: (m := worker.metrics()) and metric(m, "trainwatch_steps_checked_total",
                                                                    run="run-g") >= steps and m,
                         120, what="every step of the backlog checked")
    assert metric(samples, "trainwatch_missing_rank_windows_total", run="run-g") == 0
    assert not [v for v in _invariant_violations(kafka_broker.bootstrap) if v["run"] == "run-g"]


def test_grace_runs_on_event_time_while_the_partition_has_unread_records():
    from stream_checkers.windows.grace import grace_expired

    base = dict(now=100.0, last_batch_at=95.0, newest_producer_ts=50.0, grace=3.0)
    assert not grace_expired(**{**base, "now": 97.0}, partition_lag=0, partition_event_time=None)
    assert grace_expired(**base, partition_lag=0, partition_event_time=50.0)  # caught up: wall clock
    assert grace_expired(**base, partition_lag=None, partition_event_time=None)  # lag unknown: wall clock
    assert not grace_expired(**base, partition_lag=500, partition_event_time=52.9)  # behind: read on
    assert grace_expired(**base, partition_lag=500, partition_event_time=53.0)
