"""The private Faust and aiokafka members `stream_checkers.faust_compat` relies on, one test each.

pyproject.toml bounds faust-streaming and aiokafka to the releases these were read
from; a release that renames or reshapes one of them fails here, by name, instead of
as a silent loss of recovery or commit safety in a running checker.
"""

from __future__ import annotations

import inspect

import aiokafka
import faust.transport.consumer as faust_consumer
import pytest
from faust.transport.drivers import aiokafka as faust_aiokafka

from stream_checkers.faust_compat import transport


def _parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_consumer_thread_builds_its_aiokafka_consumer_in_create_worker_consumer():
    create = faust_aiokafka.AIOKafkaConsumerThread._create_worker_consumer
    assert _parameters(create) == ["self", "transport"]
    assert "AIOKafkaConsumer" in str(inspect.signature(create).return_annotation)


def test_aiokafka_start_reads_fetch_max_wait_ms_from_the_private_attribute():
    # transport sets `_fetch_max_wait_ms` after construction; start() must still read it then
    consumer_init = inspect.getsource(aiokafka.AIOKafkaConsumer.__init__)
    assert "self._fetch_max_wait_ms = fetch_max_wait_ms" in consumer_init
    assert "self._fetch_max_wait_ms" in inspect.getsource(aiokafka.AIOKafkaConsumer.start)


def test_consumer_thread_highwaters_is_a_coroutine_over_a_partition_list():
    highwaters = faust_aiokafka.AIOKafkaConsumerThread._highwaters
    assert inspect.iscoroutinefunction(highwaters)
    assert _parameters(highwaters) == ["self", "partitions"]


def test_consumer_thread_ensure_consumer_returns_the_aiokafka_consumer():
    ensure = faust_aiokafka.AIOKafkaConsumerThread._ensure_consumer
    assert _parameters(ensure) == ["self"]
    assert "AIOKafkaConsumer" in str(inspect.signature(ensure).return_annotation)
    assert _parameters(faust_aiokafka.AIOKafkaConsumerThread.call_thread)[:2] == ["self", "fun"]


def test_consumer_makes_its_thread_in_new_consumer_thread_and_keeps_it_as_thread():
    assert _parameters(faust_aiokafka.Consumer._new_consumer_thread) == ["self"]
    assert "self._thread = self._new_consumer_thread()" in inspect.getsource(faust_aiokafka.ThreadDelegateConsumer)


def test_consumer_filters_committable_offsets_and_decides_should_commit():
    assert _parameters(faust_consumer.Consumer._filter_committable_offsets) == ["self", "tps"]
    assert _parameters(faust_consumer.Consumer._should_commit) == ["self", "tp", "offset"]
    # the override is reached from Faust's commit path, not only defined
    assert "self._filter_committable_offsets(" in inspect.getsource(faust_consumer.Consumer)


def test_consumer_keeps_committed_offsets_by_partition_in_committed_offset():
    assert "self._committed_offset" in inspect.getsource(faust_consumer.Consumer.__init__)


def test_the_compat_classes_override_exactly_these_members():
    thread, consumer = transport._HighwaterConsumerThread, transport._HighwaterConsumer
    for owner, name in [(thread, "_create_worker_consumer"), (thread, "_highwaters"),
                        (consumer, "_new_consumer_thread"), (consumer, "_filter_committable_offsets")]:
        assert name in vars(owner), name
        assert hasattr(owner.__mro__[1], name), f"{owner.__mro__[1].__name__}.{name} is gone"


@pytest.mark.parametrize("package", ["stream_checkers", "producers", "invariants", "trainwatch"])
def test_no_private_faust_or_aiokafka_member_is_used_outside_the_compat_package(package):
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / package
    private = ("_create_worker_consumer", "_highwaters", "_ensure_consumer", "_new_consumer_thread",
               "_filter_committable_offsets", "_should_commit", "_committed_offset", "_fetch_max_wait_ms")
    offenders = [f"{path.relative_to(root.parent)}: {name}"
                 for path in root.rglob("*.py") if "faust_compat" not in path.parts
                 for name in private if name in path.read_text()]
    assert not offenders
