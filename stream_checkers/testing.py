"""Helpers to drive a real checker from tests and benchmarks (no mocks).

`CheckerProcess` runs ``trainwatch serve`` as a child process (so it can be killed
with SIGKILL like a crashed pod), `read_topic` reads a topic from the beginning with
a plain kafka-python consumer (manual assignment: no consumer group, which tansu's
group admin cannot describe), `scrape` parses a ``/metrics`` page, and
`synthetic_run` builds well-formed batches for a run with chosen faults.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from invariants.codec import encode_batch
from invariants.events import batch_key, make_batch

from .embedded_broker import free_port


def wait_until(condition: Callable[[], Any], timeout_s: float, interval_s: float = 0.1, what: str = "condition") -> Any:
    """Poll ``condition`` until it returns something truthy; fail with ``what`` on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)


def scrape(url: str) -> dict[str, float]:
    """``{'name{labels}': value}`` for every sample line of a Prometheus text page."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        samples[name] = float(value)
    return samples


def metric(samples: dict[str, float], name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for key, value in samples.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += value
    return total


@dataclass
class CheckerProcess:
    """A ``trainwatch serve`` child process with its own metrics port and log file."""

    bootstrap: str
    log_path: Path
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None
    metrics_port: int = 0
    proc: subprocess.Popen | None = None

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def start(self, timeout_s: float = 60.0) -> "CheckerProcess":
        self.metrics_port = free_port()
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trainwatch.cli", "serve", "--bootstrap", self.bootstrap,
             "--metrics-port", str(self.metrics_port), *self.extra_args],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        )
        wait_until(self._metrics_up, timeout_s, 0.2, f"checker metrics endpoint (log: {self.log_path})")
        return self

    def _metrics_up(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"checker exited with {self.proc.returncode}: {self.log_text()[-2000:]}")
        try:
            scrape(self.metrics_url)
            return True
        except OSError:
            return False

    def metrics(self) -> dict[str, float]:
        return scrape(self.metrics_url)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks, no final flush or commit — a crashed worker."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._close_log()

    def stop(self, timeout_s: float = 20.0) -> int | None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self._close_log()
        return proc.returncode if proc is not None else None

    def _close_log(self) -> None:
        log = getattr(self, "_log", None)
        if log is not None:
            log.close()
            self._log = None


def read_topic(bootstrap: str, topic: str, *, timeout_s: float = 2.0) -> list[Any]:
    """Every record currently in ``topic`` (all partitions, from the beginning)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=int(timeout_s * 1000))
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        if not tps:
            return []
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        return list(consumer)
    finally:
        consumer.close()


def _event(kind: str, t: int, stage: str = "train", **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "t": t, "pid": 1000, "tid": 1, "stage": stage, **fields}


def synthetic_step_batch(run: str, rank: int, world: int, step: int, *, seq: int | None = None,
                         digest: str | None = None, end: bool = True, loss: float | None = None,
                         extra: Iterable[dict[str, Any]] = ()) -> dict[str, Any]:
    """One rank's batch of one step of a tiny DDP-like run: backward, optimizer step with
    pre/post parameter snapshots (digest equal on all ranks unless ``digest`` is given),
    and the step end marker."""
    t = time.time_ns()
    data = digest or f"x3:{step:016x}"
    before = f"x3:{step - 1:016x}" if step else "x3:init"
    param = {"shape": [4, 4], "dtype": "torch.float32", "device": "cpu", "requires_grad": True,
             "is_leaf": True, "grad_norm": 0.5, "numel": 16, "module": "fc", "mtype": "Linear"}
    events = [
        _event("step", t, phase="begin"),
        _event("call", t, name="torch.optim.sgd.SGD.zero_grad", api="torch.optim.Optimizer.zero_grad", phase="pre",
               cid=3, parent=None, args={}),
        _event("call", t, name="torch.optim.sgd.SGD.zero_grad", api="torch.optim.Optimizer.zero_grad", phase="post",
               cid=3, parent=None),
        _event("call", t, name="torch.Tensor.backward", api="torch.Tensor.backward", phase="pre", cid=1,
               parent=None, args={"self": {"T": "tensor", "shape": [], "dtype": "torch.float32",
                                           "value": loss if loss is not None else 1.0 / (step + 1)}}),
        _event("call", t, name="torch.Tensor.backward", api="torch.Tensor.backward", phase="post", cid=1, parent=None),
        _event("call", t, name="torch.optim.sgd.SGD.step", api="torch.optim.Optimizer.step", phase="pre", cid=2,
               parent=None, args={}),
        _event("state", t, name="fc.weight", vtype="torch.nn.Parameter", at="pre:torch.optim.Optimizer.step", cid=2,
               attrs={**param, "data_digest": before, "grad_digest": "x3:g", "data_norm": 1.0}),
        _event("state", t, name="fc.weight", vtype="torch.nn.Parameter", at="post:torch.optim.Optimizer.step", cid=2,
               attrs={**param, "data_digest": data, "grad_digest": "x3:g", "data_norm": 1.001}),
        _event("call", t, name="torch.optim.sgd.SGD.step", api="torch.optim.Optimizer.step", phase="post", cid=2,
               parent=None),
        *extra,
    ]
    if end:
        events.append(_event("step", t, phase="end"))
    return make_batch(run=run, rank=rank, world=world, step=step, seq=step if seq is None else seq, events=events)


def produce(bootstrap: str, topic: str, batches: Iterable[dict[str, Any]]) -> int:
    """Send encoded batches keyed ``run:step``; returns how many were sent."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    count = 0
    try:
        for batch in batches:
            producer.send(topic, key=batch_key(batch["run"], batch["step"]), value=encode_batch(batch))
            count += 1
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=10)
    return count


def produce_raw(bootstrap: str, topic: str, records: Iterable[tuple[bytes | None, bytes]]) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, max_request_size=8 * 1024 * 1024)
    try:
        for key, value in records:
            producer.send(topic, key=key, value=value)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=10)


def iter_violations(records: Iterable[Any]) -> Iterator[dict[str, Any]]:
    from .report import decode_violation

    for record in records:
        yield decode_violation(record.value)
