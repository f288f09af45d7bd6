"""Changelog end offsets for Faust's table recovery, taken from fetch high-watermarks.

Faust decides that a table partition is restored when its changelog consumer reaches
the partition's end offset, which it asks the broker for with ListOffsets(latest).
tansu answers that request wrongly: at rest its answer can lag the true end of a
partition (even with one record per produce batch), so recovery stops before the
newest changelog records and the worker carries on with stale tables — a window open
at a crash comes back without a batch that was folded (and whose source offset was
committed), and is later reported as missing a rank (docs/design.md, "Brokers in tests").

The high-watermark a broker returns with every Fetch response is right on tansu and on
Apache Kafka alike, so the recovery end offset is taken from a tiny fetch instead:
`FetchHighwaterProbe` reads one record batch per partition with a group-less
kafka-python consumer and reports the high-watermark that came back.  The Faust
transport below plugs it into the consumer's ``highwaters()`` — the one call
recovery uses to bound each changelog partition.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Iterable, Mapping, Protocol

from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

log = logging.getLogger("trainwatch.checker")

#: How long a probe may take before recovery falls back to the broker's ListOffsets answer.
PROBE_TIMEOUT_S = 10.0


class FetchHighwaterProbe:
    """Answers "where does this partition end?" from Fetch responses, not ListOffsets."""

    def __init__(self, bootstrap_servers: list[str], client_kwargs: Mapping[str, Any] | None = None,
                 timeout_s: float = PROBE_TIMEOUT_S) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.client_kwargs = dict(client_kwargs or {})
        self.timeout_s = timeout_s

    def end_offsets(self, partitions: Iterable[TP], hints: Mapping[TP, int] | None = None) -> dict[TP, int]:
        """The fetch high-watermark of each partition (blocking; run it off the event loop).

        ``hints`` (ListOffsets answers, or the offset an agent waits at) only choose where
        to fetch from, so that the probe reads about one batch per partition rather than
        the whole log; a hint that points past the end is answered by the broker with an
        out-of-range error, and the probe then starts from the beginning.  Partitions that gave no answer within the
        timeout are left out.
        """
        from kafka import KafkaConsumer, TopicPartition

        wanted = {TopicPartition(tp.topic, tp.partition): tp for tp in partitions}
        if not wanted:
            return {}
        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap_servers,
            enable_auto_commit=False,
            auto_offset_reset="earliest",  # an out-of-range hint restarts from the beginning
            max_partition_fetch_bytes=1,  # the broker still returns one whole batch
            fetch_max_wait_ms=50,
            check_crcs=False,  # only the high-watermark is read; kafka-python checks CRCs in Python
            **self.client_kwargs,
        )
        try:
            consumer.assign(list(wanted))
            for kafka_tp, tp in wanted.items():
                hint = (hints or {}).get(tp)
                if hint:
                    consumer.seek(kafka_tp, max(0, hint - 1))
                else:
                    consumer.seek_to_beginning(kafka_tp)
            found: dict[TP, int] = {}
            deadline = time.monotonic() + self.timeout_s
            while len(found) < len(wanted) and time.monotonic() < deadline:
                consumer.poll(timeout_ms=100)
                for kafka_tp, tp in wanted.items():
                    highwater = consumer.highwater(kafka_tp)
                    if highwater is not None:
                        found[tp] = highwater
            return found
        finally:
            consumer.close(autocommit=False)


    def first_offset_from(self, tp: TP, offset: int) -> int | None:
        """The offset of the first record at or after ``offset`` that the broker hands out
        (blocking; None when the partition has none there or did not answer in time).

        An offset outside the partition (deleted by retention, or past its end) is
        answered from the partition's beginning, as ``auto_offset_reset`` would.
        """
        from kafka import KafkaConsumer, TopicPartition

        kafka_tp = TopicPartition(tp.topic, tp.partition)
        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap_servers,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=1,
            fetch_max_wait_ms=50,
            check_crcs=False,  # only offsets are read
            **self.client_kwargs,
        )
        try:
            consumer.assign([kafka_tp])
            consumer.seek(kafka_tp, offset)
            deadline = time.monotonic() + self.timeout_s
            while time.monotonic() < deadline:
                records = consumer.poll(timeout_ms=100, max_records=1).get(kafka_tp)
                if records:
                    return int(records[0].offset)
                highwater = consumer.highwater(kafka_tp)
                if highwater is not None and highwater <= consumer.position(kafka_tp):
                    return None
            return None
        finally:
            consumer.close(autocommit=False)


#: Longest a fetch may wait at the broker for data.  Faust hardcodes 1500 ms.  Apache
#: Kafka answers as soon as data arrives, so there the value only bounds idle polls;
#: brokers that hold a fetch for its whole wait (tansu) add up to this much to the
#: detection latency of a step whose batches arrive while a fetch is pending.
FETCH_MAX_WAIT_MS = 200


class _HighwaterConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """Faust's consumer thread with end offsets checked against fetch high-watermarks."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # read by AIOKafkaConsumer.start() when it builds its fetcher; there is no setting
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS
        return consumer

    async def _highwaters(self, partitions: list[TP]) -> Mapping[TP, int]:
        listed = dict(await super()._highwaters(partitions))
        probe: FetchHighwaterProbe | None = getattr(self.transport, "highwater_probe", None)
        if probe is None or self.consumer.in_transaction:
            return listed
        loop = asyncio.get_running_loop()
        try:
            fetched = await loop.run_in_executor(None, probe.end_offsets, list(partitions), listed)
        except Exception:  # the broker's own answer is still better than no recovery
            log.exception("fetch high-watermark probe failed; using ListOffsets answers")
            return listed
        for tp in partitions:
            if tp in fetched and fetched[tp] != listed.get(tp):
                log.info("end offset of %s: ListOffsets said %s, fetch high-watermark is %s",
                         tp, listed.get(tp), fetched[tp])
        return {**listed, **fetched}

    async def committed_offset(self, tp: TP) -> int | None:
        """The group's committed offset of ``tp`` as the broker has it (None: never committed)."""
        return await self.call_thread(self._ensure_consumer().committed, tp)


class CommitLimit(Protocol):
    def commit_limit(self, tp: TP, offset: int) -> int | None: ...


class _HighwaterConsumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return _HighwaterConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def committed_offset(self, tp: TP) -> int | None:
        return await self._thread.committed_offset(tp)  # type: ignore[attr-defined]

    def _filter_committable_offsets(self, tps: Iterable[TP]) -> dict[TP, int]:
        """Faust's commit offsets, capped by what the agent has really handled (`InputOrder`)."""
        offsets = super()._filter_committable_offsets(tps)
        gate: CommitLimit | None = getattr(self.transport, "commit_gate", None)
        if gate is None:
            return offsets
        capped: dict[TP, int] = {}
        for tp, offset in offsets.items():
            limit = gate.commit_limit(tp, offset)
            if limit is not None and self._should_commit(tp, limit):
                capped[tp] = limit
        return capped


class HighwaterTransport(faust_aiokafka.Transport):
    """The aiokafka transport whose consumers bound recovery by fetch high-watermarks.

    ``commit_gate``, when set, caps every offset commit (see `InputOrder.commit_limit`).
    """

    Consumer = _HighwaterConsumer

    def __init__(self, *args: Any, highwater_probe: FetchHighwaterProbe | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.highwater_probe = highwater_probe
        self.commit_gate: CommitLimit | None = None
