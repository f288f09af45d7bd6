"""`trainwatch watch` end to end: real torchrun training, real broker, real checker."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from stream_checkers.embedded_broker import free_port
from tests.support.kafka import iter_violations, metric, read_topic, scrape

ROOT = Path(__file__).resolve().parents[2]
DDP = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
       str(ROOT / "examples" / "ddp_gloo.py"), "--steps", "6"]


def _watch(args: list[str], env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([sys.executable, "-m", "trainwatch.cli", "watch", *args], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()  # watch tears its broker, checker and training down on SIGTERM
        stdout, stderr = proc.communicate(timeout=60)
        pytest.fail(f"watch timed out after {timeout}s: {stderr[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


class MetricsPoller(threading.Thread):
    """Scrapes /metrics while watch runs (its checker is gone once watch exits)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.latest: dict[str, float] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.3):
            try:
                self.latest = scrape(self.url, timeout_s=2)
            except OSError:
                continue


def test_watch_reports_a_cross_rank_divergence_on_topic_metrics_and_console(kafka_broker, clean_env):
    port = free_port()
    poller = MetricsPoller(f"http://127.0.0.1:{port}/metrics")
    poller.start()
    k = 3
    try:
        result = _watch(["--bootstrap", kafka_broker.bootstrap, "--metrics-port", str(port), "--run-id", "ddp-bug",
                         "--", *DDP, "--perturb-rank", "1", "--perturb-step", str(k)], clean_env)
    finally:
        poller.done.set()
        poller.join(5)
    assert result.returncode == 1, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("VIOLATION")]
    assert lines, result.stdout + result.stderr[-3000:]
    assert any("[Consistent]" in line and "run=ddp-bug" in line for line in lines)
    assert "run      ddp-bug" in result.stderr and "embedded" not in result.stderr
    assert "violation(s)" in result.stderr.splitlines()[-1]
    assert "in 12 training iterations (ranks 0-1; setup window checked; " in result.stderr.splitlines()[-1]

    records = [v for v in iter_violations(read_topic(kafka_broker.bootstrap, "trainwatch.violations"))
               if v["run"] == "ddp-bug" and v["relation"] == "Consistent"]
    assert records and min(v["step"] for v in records) <= k + 1
    samples = poller.latest
    assert metric(samples, "trainwatch_violations_total", run="ddp-bug", relation="Consistent") >= 1
    assert metric(samples, "trainwatch_first_violation_step", run="ddp-bug") <= k + 1
    assert metric(samples, "trainwatch_steps_checked_total", run="ddp-bug") >= 6


def test_watch_on_the_healthy_job_exits_0_with_an_embedded_broker_and_keeps_traces(tmp_path, clean_env):
    traces = tmp_path / "traces"
    result = _watch(["-o", str(traces), "--run-id", "ddp-ok", "--", *DDP], clean_env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "VIOLATION" not in result.stdout
    assert "embedded tansu broker" in result.stderr
    summary = result.stderr.strip().splitlines()[-1]
    assert summary == ("trainwatch watch: run ddp-ok: no violation in 12 training iterations (ranks 0-1; "
                       "setup window checked; 0 windows unchecked); training exited 0")
    assert len(list(traces.glob("*.twtrace"))) == 2


def test_watch_reports_a_failing_training_command(clean_env):
    result = _watch(["--", sys.executable, "-c", "import sys; sys.exit(3)"], clean_env, timeout=120)
    assert result.returncode == 2
    assert "training FAILED with exit code 3" in result.stderr


@pytest.mark.parametrize("args, message", [
    ([], "no command given"),
    (["-i", "/nonexistent/inv.json", "--", "true"], "does not exist"),
])
def test_watch_usage_errors(args, message, clean_env):
    result = _watch(args, clean_env, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr


SAME_AUGMENTATION = [sys.executable, str(ROOT / "benchmarks" / "silent_bugs" / "dataloader_same_augmentation.py"),
                     "--onset", "3", "--steps", "6"]


@pytest.mark.parametrize("buggy", [True, False], ids=["bug", "healthy-twin"])
def test_watch_judges_a_step_only_after_its_dataloader_workers_reported(kafka_broker, clean_env, buggy):
    """Forked DataLoader workers send their seeds over their own connections, after the
    rank's step end.  The step waits for them, so two workers sharing one augmentation
    RNG are caught live exactly as offline; none of their batches counts as late."""
    port = free_port()
    poller = MetricsPoller(f"http://127.0.0.1:{port}/metrics")
    poller.start()
    run_id = f"same-aug-{'bug' if buggy else 'ok'}"
    try:
        result = _watch(["--bootstrap", kafka_broker.bootstrap, "--metrics-port", str(port), "--run-id", run_id,
                         "--", *SAME_AUGMENTATION, *(["--bug"] if buggy else [])], clean_env)
    finally:
        poller.done.set()
        poller.join(5)
    lines = [line for line in result.stdout.splitlines() if line.startswith("VIOLATION")]
    assert metric(poller.latest, "trainwatch_late_batches_total", run=run_id) == 0
    assert metric(poller.latest, "trainwatch_missing_rank_windows_total", run=run_id) == 0
    if buggy:
        assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
        # iteration 3 (the onset) is step 4: step 0 is the setup window
        assert any(f"run={run_id} step=4 " in line and "[APIArg]" in line and "worker_init" in line
                   for line in lines), lines
    else:
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
        assert lines == []


PAUSING_TRAINER = """
import os, sys, time
import torch
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
ready, go = sys.argv[1], sys.argv[2]
for step in range(40):
    if step == 10:
        open(ready, "w").close()
        deadline = time.monotonic() + 120
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.05)
    optimizer.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    optimizer.step()
"""


def _children_named(parent: int, word: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and word in cmdline:
            found.append(int(entry.name))
    return found


def test_watch_whose_broker_dies_mid_run_does_not_pass(tmp_path, clean_env):
    """The embedded broker is killed while training runs: the batches that never arrived
    keep the run from being checked, so the verdict is exit 2, never 'no violation'."""
    import os
    import signal
    import time

    script, ready, go = tmp_path / "pausing.py", tmp_path / "ready", tmp_path / "go"
    script.write_text(PAUSING_TRAINER)
    watch = subprocess.Popen([sys.executable, "-m", "trainwatch.cli", "watch", "--drain-timeout", "10",
                              "--", sys.executable, str(script), str(ready), str(go)],
                             env=clean_env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and watch.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), "training never reached the pause"
        brokers = _children_named(watch.pid, "tansu")
        assert len(brokers) == 1, brokers
        os.kill(brokers[0], signal.SIGKILL)
        go.touch()
        out, _ = watch.communicate(timeout=180)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    assert watch.returncode == 2, out[-3000:]
    assert "never reached the broker" in out or "did not finish this run" in out, out[-3000:]
    assert "no violation in" not in out
