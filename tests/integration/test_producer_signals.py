"""SIGTERM (how torchrun and schedulers stop workers) still leaves a complete trace.

Real training processes under the launcher's bootstrap, terminated mid-run; the
trace must end with the final step marker, and the process must end the way it
would have without instrumentation.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from producers.report import read_trace_batches, read_trace_summary

ROOT = Path(__file__).resolve().parents[2]

TRAIN_FOREVER = """
import torch
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
print("training", flush=True)
while True:
    optimizer.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
"""


def _start(script: Path, trace_dir: Path, env: dict[str, str]) -> subprocess.Popen:
    from producers.config import ProducerConfig
    from producers.launcher import child_environment

    config = ProducerConfig(run_id="term", trace_dir=str(trace_dir), quiet=True)
    return subprocess.Popen(
        [sys.executable, str(script)], env=child_environment(config, env),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _terminate_after_steps(process: subprocess.Popen, trace_dir: Path, batches: int = 3) -> Path:
    """Wait (with a deadline) until some steps are on disk, then send SIGTERM."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        files = list(trace_dir.glob("*.twtrace"))
        if files and read_trace_summary(files[0]).batches >= batches:
            process.send_signal(signal.SIGTERM)
            return files[0]
        assert process.poll() is None, process.communicate()[1]
        time.sleep(0.05)
    process.kill()
    raise AssertionError("no steps written within 60 s")


def _assert_trace_closed(trace: Path) -> None:
    batches = read_trace_batches(trace)
    last = batches[-1]["events"]
    assert any(e["kind"] == "meta" and e.get("what") == "run_end" for e in last)
    assert last[-1]["kind"] == "step" and last[-1]["phase"] == "end" and last[-1].get("final") is True
    assert [b["step"] for b in batches] == sorted(b["step"] for b in batches)


def test_sigterm_flushes_the_open_step_and_still_dies_by_sigterm(tmp_path, clean_env):
    script = tmp_path / "train.py"
    script.write_text(TRAIN_FOREVER)
    process = _start(script, tmp_path / "traces", clean_env)
    try:
        trace = _terminate_after_steps(process, tmp_path / "traces")
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == -signal.SIGTERM, stderr  # default semantics kept
    _assert_trace_closed(trace)


def test_sigterm_chains_to_the_programs_own_handler(tmp_path, clean_env):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import signal, sys

        def on_term(signum, frame):
            print("user handler ran", flush=True)
            sys.exit(7)

        signal.signal(signal.SIGTERM, on_term)
    """) + TRAIN_FOREVER)
    process = _start(script, tmp_path / "traces", clean_env)
    try:
        trace = _terminate_after_steps(process, tmp_path / "traces")
        stdout, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 7, stderr
    assert "user handler ran" in stdout
    _assert_trace_closed(trace)
