"""Process-level plumbing shared by ``trainwatch watch``, tests and benchmarks.

`CheckerProcess` owns a ``trainwatch serve`` child (start, readiness through its
``/metrics`` endpoint, SIGTERM or SIGKILL); `TopicReader` reads a topic without a
consumer group and knows when it has caught up.  Catching up is judged from the
fetch high-watermark, because tansu's ListOffsets(latest) answer cannot be trusted
(docs/design.md, "Brokers in tests").
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
from typing import Any, Callable

from ..embedded_broker import free_port


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


def scrape(url: str, timeout_s: float = 5.0) -> dict[str, float]:
    """``{'name{labels}': value}`` for every sample line of a Prometheus text page."""
    text = urllib.request.urlopen(url, timeout=timeout_s).read().decode()
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
    _log: Any = field(default=None, repr=False)

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout_s: float = 60.0) -> "CheckerProcess":
        return self.launch().wait_ready(timeout_s)

    def launch(self) -> "CheckerProcess":
        """Start the process without waiting (to start several workers at once)."""
        if not self.metrics_port:
            self.metrics_port = free_port()
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.setdefault("OMP_NUM_THREADS", "1")
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trainwatch.cli", "serve", "--bootstrap", self.bootstrap,
             "--metrics-port", str(self.metrics_port), "--metrics-host", "127.0.0.1", *self.extra_args],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True,  # Ctrl-C in the terminal is the parent's to handle
        )
        return self

    def wait_ready(self, timeout_s: float = 60.0) -> "CheckerProcess":
        try:
            wait_until(self._metrics_up, timeout_s, 0.2, f"the checker's metrics endpoint (log: {self.log_path})")
        except BaseException:
            self.stop()
            raise
        return self

    def _metrics_up(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log_text().strip().splitlines()[-3:]
            raise RuntimeError(f"checker exited with code {self.proc.returncode}: {' | '.join(tail)}")
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
        if self.running:
            self.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
            self.proc.wait(timeout=10)  # type: ignore[union-attr]
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
        if self._log is not None:
            self._log.close()
            self._log = None


class TopicReader:
    """Reads every partition of a topic from the beginning, without a consumer group."""

    def __init__(self, bootstrap: str, topic: str, security_kwargs: dict[str, Any] | None = None) -> None:
        from kafka import KafkaConsumer

        self.topic = topic
        self._consumer = KafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, **(security_kwargs or {})
        )
        self._assigned: list[Any] = []

    def _assign(self) -> bool:
        from kafka import TopicPartition

        if self._assigned:
            return True
        partitions = self._consumer.partitions_for_topic(self.topic)
        if not partitions:
            return False
        self._assigned = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        self._consumer.assign(self._assigned)
        self._consumer.seek_to_beginning(*self._assigned)
        return True

    def poll(self, timeout_s: float = 0.2) -> list[Any]:
        """New records since the last call (possibly none)."""
        if not self._assign():
            self._consumer.topics()  # refresh metadata: the topic may appear later
            time.sleep(min(timeout_s, 0.1))
            return []
        batches = self._consumer.poll(timeout_ms=int(timeout_s * 1000))
        records = [record for part in batches.values() for record in part]
        records.sort(key=lambda r: (r.timestamp, r.partition, r.offset))
        return records

    def caught_up(self) -> bool:
        """Every partition's position has reached its last known high-watermark."""
        if not self._assigned:
            return False
        for tp in self._assigned:
            highwater = self._consumer.highwater(tp)
            if highwater is None or self._consumer.position(tp) < highwater:
                return False
        return True

    def read_all(self, timeout_s: float = 10.0) -> list[Any]:
        """Everything in the topic now: poll until caught up (bounded)."""
        records: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            records.extend(self.poll(0.1))
            if self.caught_up():
                break
        return records

    def close(self) -> None:
        self._consumer.close()
