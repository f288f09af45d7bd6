"""The streaming checker recovers: after `kill -9`, a restarted worker or a second
one taking over reports every violation exactly once, and the Kafka plumbing under
recovery (end offsets, records lost between fetch and agent) holds against a real broker.

Runs are synthetic batches produced straight to Kafka (fast and deterministic); the
expected violations come from the offline engine (`StepWindows`) over the same
batches, so "equal to an uninterrupted run" is checked against one code path.
"""

from __future__ import annotations

import collections

import pytest

from tests.support.kafka import metric, produce, wait_until
from tests.support.stream_runs import EVENTS
from tests.support.stream_runs import expected_ids as _expected_ids
from tests.support.stream_runs import invariant_violations as _invariant_violations
from tests.support.stream_runs import run_batches as _run_batches


def _kill_and_recover(kafka_broker, checker, pinned_invariants: str, *, takeover: bool) -> None:
    batches = _run_batches("run-k", range(30), diverge_from=10)
    expected = _expected_ids(batches, pinned_invariants)
    by_step = {(b["step"], b["rank"]): b for b in batches}
    before = [by_step[(s, r)] for s in range(15) for r in (0, 1)]
    half_open = [by_step[(s, 0)] for s in range(15, 22)]  # rank 0 only: windows open at the crash
    after = [by_step[(s, 1)] for s in range(15, 22)] + [by_step[(s, r)] for s in range(22, 30) for r in (0, 1)]
    slow_grace = ["--grace-seconds", "30"]  # open windows must survive the crash, not time out
    first = checker("w1", slow_grace)
    second = checker("w2", slow_grace) if takeover else None
    produce(kafka_broker.bootstrap, EVENTS, before + half_open)
    wait_until(lambda: metric(first.metrics(), "trainwatch_batches_consumed_total", run="run-k")
               + (metric(second.metrics(), "trainwatch_batches_consumed_total", run="run-k") if second else 0)
               >= len(before) + len(half_open), 60, what="the pre-crash batches consumed")
    assert len(_invariant_violations(kafka_broker.bootstrap)) >= 5
    first.kill()
    produce(kafka_broker.bootstrap, EVENTS, after)
    survivor = checker("w1-restarted", slow_grace) if not takeover else second
    try:
        wait_until(lambda: {v["id"] for v in _invariant_violations(kafka_broker.bootstrap)} >= expected, 90,
                   what="every violation after the crash")
    except TimeoutError:
        found = {(v["step"], v["relation"]) for v in _invariant_violations(kafka_broker.bootstrap)}
        pytest.fail(f"violations after the crash: {sorted(found)}\nsurvivor log:\n{survivor.log_text()[-3000:]}")
    ids = [v["id"] for v in _invariant_violations(kafka_broker.bootstrap)]
    duplicates = [i for i, n in collections.Counter(ids).items() if n > 1]
    assert not duplicates
    assert set(ids) == expected  # in particular no missing-rank report for the half-open windows
    if second is not None:
        assert second.proc.poll() is None


def test_kill_9_and_restart_loses_and_repeats_nothing(kafka_broker, checker, pinned_invariants):
    _kill_and_recover(kafka_broker, checker, pinned_invariants, takeover=False)


def test_second_worker_takes_over_after_kill_9(kafka_broker, checker, pinned_invariants):
    _kill_and_recover(kafka_broker, checker, pinned_invariants, takeover=True)


def test_recovery_end_offsets_come_from_the_fetch_high_watermark(kafka_broker):
    """Table recovery is bounded by `FetchHighwaterProbe`, so it must name each partition's
    true end — the offset after its last record — whatever ListOffsets(latest) says."""
    from faust.types import TP
    from kafka import KafkaProducer

    from stream_checkers.faust_compat.transport import FetchHighwaterProbe

    topic = "trainwatch.test-end-offsets"
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, linger_ms=50)
    try:
        for i in range(7):  # lingering: one multi-record batch, the case tansu answers short
            producer.send(topic, value=b"r%d" % i, partition=0)
        producer.send(topic, value=b"single", partition=1)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=10)
    probe = FetchHighwaterProbe([kafka_broker.bootstrap])
    partitions = [TP(topic, 0), TP(topic, 1), TP(topic, 2)]
    assert probe.end_offsets(partitions) == {TP(topic, 0): 7, TP(topic, 1): 1, TP(topic, 2): 0}
    # a hint past the end (or short of it) only chooses where the probe starts reading
    assert probe.end_offsets(partitions, {TP(topic, 0): 50, TP(topic, 1): 1})[TP(topic, 0)] == 7


class _FaustConsumerPart:
    """The part of Faust's consumer that `InputOrder` uses, over a real aiokafka consumer."""

    def __init__(self, consumer) -> None:
        self.consumer = consumer

    async def seek(self, tp, offset: int) -> None:
        from aiokafka import TopicPartition

        self.consumer.seek(TopicPartition(tp.topic, tp.partition), offset)

    async def committed_offset(self, tp) -> int | None:
        from aiokafka import TopicPartition

        return await self.consumer.committed(TopicPartition(tp.topic, tp.partition))

    async def earliest_offsets(self, *tps):
        from aiokafka import TopicPartition

        found = await self.consumer.beginning_offsets([TopicPartition(tp.topic, tp.partition) for tp in tps])
        return {tp: found[TopicPartition(tp.topic, tp.partition)] for tp in tps}


def test_records_lost_between_fetch_and_agent_are_read_again_and_never_committed_past(kafka_broker):
    """Faust can drop fetched records before the agent sees them (its buffers are emptied
    when flow control resumes after a rebalance).  `InputOrder` must notice the hole from
    the offsets alone, seek back on the real broker, and admit every record from the
    committed offset on, in order; until then no commit may pass the hole."""
    import asyncio
    import types

    from aiokafka import AIOKafkaConsumer, TopicPartition
    from faust.types import TP
    from kafka import KafkaProducer

    from stream_checkers.faust_compat.transport import FetchHighwaterProbe
    from stream_checkers.faust_compat.input_order import InputOrder

    topic = "trainwatch.test-input-order"
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, linger_ms=20)
    try:
        for i in range(30):  # lingering: several records per batch, as the real producers send them
            producer.send(topic, value=b"r%d" % i, partition=0)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=10)
    tp = TP(topic, 0)
    reads: collections.Counter[int] = collections.Counter()
    admitted: list[int] = []

    def lost_on_the_way(offset: int) -> bool:
        if offset in (5, 6):  # at the start of the assignment
            reads[offset] += 1
            return reads[offset] == 1
        if offset in (12, 13, 14) and 11 in admitted:  # mid-partition, twice: the first re-read
            reads[offset] += 1  # is dropped as well (Faust's fetch loop can do that after a
            return reads[offset] <= 2  # seek), and the records after it are stale by then
        return False

    async def consume() -> list[int | None]:
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, group_id="input-order",
                                    enable_auto_commit=False, auto_offset_reset="earliest")
        await consumer.start()
        try:
            kafka_tp = TopicPartition(topic, 0)
            consumer.assign([kafka_tp])
            await consumer.commit({kafka_tp: 5})  # the previous owner handled 0..4
            consumer.seek(kafka_tp, 5)
            app = types.SimpleNamespace(consumer=_FaustConsumerPart(consumer), consumer_generation_id=7)
            order = InputOrder(app, [topic], FetchHighwaterProbe([kafka_broker.bootstrap]))
            limits: list[int | None] = [order.commit_limit(tp, 30)]
            deadline = asyncio.get_running_loop().time() + 30
            while (not admitted or max(admitted) < 29) and asyncio.get_running_loop().time() < deadline:
                await order.retry_repairs()  # as the worker's timer does
                for record in (await consumer.getmany(kafka_tp, timeout_ms=200)).get(kafka_tp, []):
                    if lost_on_the_way(record.offset):
                        continue
                    if order.in_order(tp, record.offset, 7) or await order.admit(tp, record.offset, 7):
                        admitted.append(record.offset)
                        if record.offset == 11:
                            limits.append(order.commit_limit(tp, 30))  # the hole at 12 is still open
            limits.append(order.commit_limit(tp, 30))
            return limits
        finally:
            await consumer.stop()

    limits = asyncio.run(consume())
    in_order = [offset for i, offset in enumerate(admitted) if offset > max(admitted[:i], default=-1)]
    assert in_order == list(range(5, 30))
    assert reads[12] == 3
    assert limits == [None, 12, 30]


def test_probe_names_the_first_record_at_or_after_an_offset(kafka_broker):
    from faust.types import TP
    from kafka import KafkaProducer

    from stream_checkers.faust_compat.transport import FetchHighwaterProbe

    topic = "trainwatch.test-first-offset"
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, linger_ms=20)
    try:
        for i in range(6):
            producer.send(topic, value=b"r%d" % i, partition=0)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=10)
    probe = FetchHighwaterProbe([kafka_broker.bootstrap], timeout_s=5)
    assert probe.first_offset_from(TP(topic, 0), 0) == 0
    assert probe.first_offset_from(TP(topic, 0), 4) == 4  # inside a multi-record batch
    assert probe.first_offset_from(TP(topic, 0), 6) is None  # at the end: nothing there yet
