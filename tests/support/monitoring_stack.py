"""The processes of the end-to-end deploy test: a checker, a training run,
Prometheus and Alertmanager as managed children, a webhook receiver, and the
hand-made batches that give every pipeline alert real data.

Each child runs in its own session so that stopping it also stops what it started,
and every wait fails with the children's logs, because a stack of five processes
otherwise fails with nothing to read.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import pytest

import yaml

from tests.support.deploy_files import ROOT
from tests.support.monitoring_config import (
    alertmanager_config,
    compose_settings,
    prometheus_config,
    prometheus_settings,
    rules_with_short_for,
)

TRAINING_RUN = "e2e-ddp-divergence"
PIPELINE_RUN = "e2e-pipeline-faults"
PARTITIONS = 4
BLOCK_TORCH = "import sys; sys.modules['torch'] = None; from trainwatch.cli import main; sys.exit(main())"


# ------------------------------------------------------------------ small helpers


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str, diagnose: Callable[[], str] = lambda: "") -> Any:
    """Poll until `predicate` returns something truthy; fail with `what` after the deadline.

    Other exceptions mean "not ready yet" (connection refused while a server starts);
    an AssertionError is a verdict (a child exited, a query was rejected) and fails now.
    """
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except AssertionError as exc:
            pytest.fail(f"while waiting for {what}: {exc}\n{diagnose()}")
        except Exception as exc:
            last_error = exc
        time.sleep(0.25)
    pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what} (last error: {last_error!r})\n{diagnose()}")


def free_port() -> int:
    from stream_checkers.embedded_broker import free_port as pick

    return pick()


def http_json(url: str, data: dict[str, str] | None = None, timeout: float = 5.0) -> Any:
    body = urllib.parse.urlencode(data).encode() if data is not None else None
    with urllib.request.urlopen(url, data=body, timeout=timeout) as response:
        return json.loads(response.read())


@dataclass
class ManagedProcess:
    """A child process in its own session, so that stopping it also stops what it started."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    cwd: Path | None = None
    proc: subprocess.Popen | None = field(default=None, repr=False)

    def start(self) -> "ManagedProcess":
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            self.argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=self.env, cwd=self.cwd, start_new_session=True,
        )
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return f"--- {self.name} log ({self.log_path}) ---\n" + "\n".join(text)

    def stop(self, timeout_s: float = 10.0) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=timeout_s)
        if hasattr(self, "_log"):
            self._log.close()


class WebhookReceiver:
    """Alertmanager's webhook target: records every notification it is sent."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server naming)
                length = int(self.headers.get("Content-Length", "0"))
                payload = json.loads(self.rfile.read(length) or b"{}")
                with receiver._lock:
                    receiver.notifications.append({"path": self.path, "payload": payload})
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/trainwatch/alerts"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> "WebhookReceiver":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def firing_alerts(self) -> list[dict[str, Any]]:
        """Alerts of the webhook notifications (Alertmanager's JSON, version 4)."""
        with self._lock:
            return [
                alert
                for note in self.notifications
                for alert in note["payload"].get("alerts", [])
                if alert.get("status") == "firing"
            ]

    def slack_messages(self) -> list[dict[str, Any]]:
        """Attachments of the Slack-format notifications, as Slack would receive them."""
        with self._lock:
            return [
                attachment
                for note in self.notifications
                if note["path"].endswith("/slack")
                for attachment in note["payload"].get("attachments", [])
            ]


# ------------------------------------------------------------------ the hand-made batches


def _event(kind: str, **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "t": time.time_ns(), "pid": os.getpid(), "tid": 1, "stage": "train", **fields}


def publish_pipeline_faults(producer: Any, step_closed: Callable[[], bool]) -> None:
    """A 2-rank run in which rank 1 never reports step 0 in time, the loss is NaN, the
    producer admits dropping events and step 1's DataLoader workers never report; plus
    one message that is not a batch at all."""
    from invariants.codec import encode_batch
    from invariants.events import batch_key, make_batch

    topic = "trainwatch.events"
    rank0 = make_batch(run=PIPELINE_RUN, rank=0, world=2, step=0, seq=0, events=[
        _event("meta", what="run_start"),
        _event("step", phase="begin"),
        _event("call", name="torch.Tensor.backward", phase="pre", cid=1, parent=None,
               args={"self": {"T": "tensor", "shape": [], "dtype": "float32", "value": math.nan}}),
        _event("meta", what="producer_stats", dropped_events=7, dropped_batches=1,
               overhead_budget=0.05, overhead_share=0.031),  # a producer under --overhead-budget
        _event("step", phase="end"),
    ])
    producer.send(topic, key=batch_key(PIPELINE_RUN, 0), value=encode_batch(rank0))
    # Step 1: both ranks report, but the DataLoader worker each announced never does.
    for rank in (0, 1):
        step1 = make_batch(run=PIPELINE_RUN, rank=rank, world=2, step=1, seq=1, events=[
            _event("step", phase="begin"), _event("meta", what="dataloader_workers", workers=1),
            _event("step", phase="end"),
        ])
        producer.send(topic, key=batch_key(PIPELINE_RUN, 1), value=encode_batch(step1))
    producer.send(topic, key=b"not-a-run:0", value=b"\xc1 this is not msgpack")
    producer.flush(timeout=10)
    # Rank 1 reports only after the grace period closed the window without it.
    wait_until(step_closed, 30, "the checker to close step 0 of the pipeline run with a rank missing")
    rank1 = make_batch(run=PIPELINE_RUN, rank=1, world=2, step=0, seq=0, events=[
        _event("step", phase="begin"), _event("step", phase="end"),
    ])
    producer.send(topic, key=batch_key(PIPELINE_RUN, 0), value=encode_batch(rank1))
    producer.flush(timeout=10)
    producer.close(timeout=5)


# ------------------------------------------------------------------ the stack


@dataclass
class Stack:
    prometheus_url: str
    alertmanager_url: str
    checker_metrics_url: str
    webhook: WebhookReceiver
    processes: list[ManagedProcess]

    def query(self, expr: str) -> dict[str, Any]:
        return http_json(f"{self.prometheus_url}/api/v1/query", {"query": expr})

    def vector(self, expr: str) -> list[dict[str, Any]]:
        answer = self.query(expr)
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def diagnose(self) -> str:
        return "\n".join(p.log_tail() for p in self.processes)


def alive(process: ManagedProcess, probe: Callable[[], Any]) -> Callable[[], Any]:
    """A readiness probe that fails at once if the process already exited."""
    def check() -> Any:
        assert process.running(), f"{process.name} exited with code {process.proc.returncode}"
        return probe()
    return check


def start_checker(tmp: Path, env: dict[str, str], bootstrap: str, port: int) -> ManagedProcess:
    command, checker_env = compose_settings("checker", {
        "TRAINWATCH_BOOTSTRAP": bootstrap,
        "TRAINWATCH_METRICS_HOST": "127.0.0.1",
        "TRAINWATCH_METRICS_PORT": str(port),
        "TRAINWATCH_PARTITIONS": str(PARTITIONS),
        "TRAINWATCH_GRACE_SECONDS": "1",
    })
    return ManagedProcess("checker", [sys.executable, "-c", BLOCK_TORCH, *command],
                          tmp / "checker.log", env={**env, **checker_env}, cwd=tmp).start()


def training_run(tmp: Path, env: dict[str, str], bootstrap: str) -> ManagedProcess:
    """2-rank DDP on gloo where rank 1 silently nudges a weight after step 2."""
    return ManagedProcess("training", [
        sys.executable, "-m", "trainwatch.cli", "collect", "--bootstrap", bootstrap, "--run-id", TRAINING_RUN, "--",
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        str(ROOT / "examples" / "ddp_gloo.py"), "--steps", "6", "--perturb-rank", "1", "--perturb-step", "2",
    ], tmp / "training.log", env=env, cwd=tmp)


def start_alertmanager(binary: str, tmp: Path, webhook_url: str, port: int) -> ManagedProcess:
    config = tmp / "alertmanager.yml"
    config.write_text(yaml.safe_dump(alertmanager_config(webhook_url)))
    return ManagedProcess("alertmanager", [
        binary, f"--config.file={config}", f"--storage.path={tmp / 'am-data'}",
        f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
    ], tmp / "alertmanager.log").start()


def start_prometheus(binary: str, tmp: Path, env: dict[str, str], checker_port: int,
                     alertmanager_port: int, port: int) -> ManagedProcess:
    rules_with_short_for(tmp / "rules")
    config = tmp / "prometheus.yml"
    config.write_text(yaml.safe_dump(prometheus_config(tmp / "rules", checker_port, alertmanager_port, port)))
    feature_flags, prometheus_env = prometheus_settings()
    return ManagedProcess("prometheus", [
        binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'prom-data'}",
        f"--web.listen-address=127.0.0.1:{port}", *feature_flags,
    ], tmp / "prometheus.log", env={**env, **prometheus_env}).start()
