"""The Kafka sink against a real Kafka-protocol broker (tansu) on a loopback port."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from kafka import KafkaConsumer, TopicPartition
from kafka.partitioner.default import murmur2

from invariants.codec import decode_batch, encode_batch
from invariants.events import make_batch
from producers.report import read_trace_dir
from producers.sinks import KafkaSink
from stream_checkers.embedded_broker import free_port

ROOT = Path(__file__).resolve().parents[2]
TOPIC = "trainwatch.events"


def wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)


class TopicReader:
    """Reads a topic from the beginning with manual assignment (no consumer group)."""

    def __init__(self, bootstrap: str, topic: str = TOPIC) -> None:
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
        self.topic = topic
        self.messages: list = []
        self.partitions: set[int] | None = None

    def _assign(self) -> bool:
        if self.partitions is None:
            partitions = self.consumer.partitions_for_topic(self.topic)
            if not partitions:
                self.consumer.poll(timeout_ms=100)  # refresh metadata
                return False
            self.partitions = set(partitions)
            assigned = [TopicPartition(self.topic, p) for p in sorted(partitions)]
            self.consumer.assign(assigned)
            self.consumer.seek_to_beginning(*assigned)
        return True

    def poll(self) -> int:
        if self._assign():
            for records in self.consumer.poll(timeout_ms=200).values():
                self.messages.extend(records)
        return len(self.messages)

    def read_at_least(self, count: int, timeout_s: float = 30) -> list:
        wait_for(lambda: self.poll() >= count, timeout_s, f"{count} messages on {self.topic}")
        return self.messages

    def close(self) -> None:
        self.consumer.close()


def expected_partition(key: bytes, partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def test_batches_arrive_keyed_run_step_on_the_murmur2_partition(kafka_broker):
    sink = KafkaSink(kafka_broker.bootstrap, TOPIC)
    sent = []
    for step in range(12):
        for rank in (0, 1):
            batch = make_batch(run="kr", rank=rank, world=2, step=step, seq=step, events=[
                {"kind": "step", "t": 1, "pid": 1, "tid": 1, "stage": "train", "phase": "end"}])
            payload = encode_batch(batch)
            sink.write(batch, payload)
            sent.append(payload)
    sink.close(timeout_s=15)
    assert sink.stats().as_dict() == {"sent_batches": 24, "sent_events": 24, "dropped_batches": 0, "dropped_events": 0}
    reader = TopicReader(kafka_broker.bootstrap)
    try:
        messages = reader.read_at_least(24)
        assert len(reader.partitions) > 1
        assert sorted(m.value for m in messages) == sorted(sent)
        partitions_used = set()
        for message in messages:
            batch = decode_batch(message.value)
            assert message.key == f"kr:{batch['step']}".encode()
            assert message.partition == expected_partition(message.key, len(reader.partitions))
            partitions_used.add(message.partition)
        assert len(partitions_used) > 1, "consecutive steps spread over partitions"
    finally:
        reader.close()


def _collect(args: list[str], env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "trainwatch.cli", "collect", *args], env=env, cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw,
    )


def test_collect_streams_the_same_bytes_as_the_trace(kafka_broker, tmp_path, clean_env):
    process = _collect(
        ["--bootstrap", kafka_broker.bootstrap, "-o", str(tmp_path), "--run-id", "kc", "--",
         sys.executable, "examples/mlp.py", "--steps", "3"], clean_env)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert "no batches dropped" in err
    (batches,) = read_trace_dir(tmp_path).values()
    reader = TopicReader(kafka_broker.bootstrap)
    try:
        messages = reader.read_at_least(len(batches))
        assert sorted(m.value for m in messages) == sorted(encode_batch(b) for b in batches)
        assert {m.key for m in messages} == {b"kc:0", b"kc:1", b"kc:2", b"kc:3", b"kc:4"}
    finally:
        reader.close()


TRAIN_UNTIL_TOLD = """
import sys, time
from pathlib import Path
import torch
stop = Path(sys.argv[1])
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(20000):
    optimizer.zero_grad()
    model(torch.randn(4, 8)).pow(2).mean().backward()
    optimizer.step()
    if stop.exists():
        break
    time.sleep(0.005)
print("trained", step + 1, "steps")
"""


def test_broker_killed_mid_run_training_completes_and_drops_are_counted(kafka_broker, tmp_path, clean_env):
    script = tmp_path / "train.py"
    script.write_text(TRAIN_UNTIL_TOLD)
    stop = tmp_path / "stop"
    traces = tmp_path / "traces"
    process = _collect(
        ["--bootstrap", kafka_broker.bootstrap, "-o", str(traces), "--run-id", "kk", "--flush-timeout", "2", "--",
         sys.executable, str(script), str(stop)], clean_env)
    reader = TopicReader(kafka_broker.bootstrap)
    try:
        reader.read_at_least(3, timeout_s=60)
        kafka_broker.kill()

        def trace_batches() -> int:
            files = list(traces.glob("*.twtrace"))
            return len(next(iter(read_trace_dir(traces).values()))) if files else 0

        seen_at_kill = trace_batches()
        wait_for(lambda: trace_batches() >= seen_at_kill + 5, 60, "training to go on without the broker")
        stop.write_text("")
        out, err = process.communicate(timeout=60)
    finally:
        reader.close()
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert "trained" in out
    dropped_line = next(line for line in err.splitlines() if "kafka:" in line)
    dropped = int(dropped_line.split(":")[-1].split()[0])
    assert dropped >= 5, err
    row = next(line for line in err.splitlines() if "kk-rank0" in line).split()
    assert int(row[5]) == dropped
    (batches,) = read_trace_dir(traces).values()
    assert [b["step"] for b in batches] == list(range(len(batches)))
    assert batches[-1]["events"][-1].get("final") is True, "the trace is complete despite the dead broker"


def test_unreachable_broker_never_blocks_training(tmp_path, clean_env):
    dead = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    process = _collect(["--bootstrap", dead, "--run-id", "kd", "--flush-timeout", "1", "--",
                        sys.executable, "examples/mlp.py", "--steps", "3"], clean_env)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert "is not reachable" in err
    assert "5 batches dropped" in err  # setup, 3 iterations, the tail
    assert time.monotonic() - started < 60
