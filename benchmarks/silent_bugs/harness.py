"""Thin wrappers around the ``trainwatch`` command line, as a user would run it.

The benchmark drives trainwatch through its public CLI (docs/cli.md) rather than its
Python internals, so that it measures what users get and breaks when the contract does.
Every child runs with one OpenMP thread and without leaked ``TRAINWATCH_*`` settings.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parents[2]
TRAINWATCH = (sys.executable, "-m", "trainwatch.cli")
GLOO_TEARDOWN_ABORT = "terminate called without an active exception"


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINWATCH_")}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    return env


@dataclass
class CollectResult:
    trace_dir: Path
    returncode: int
    seconds: float
    output_tail: str = ""


@dataclass
class CheckResult:
    exit_code: int
    report: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    @property
    def violations(self) -> list[dict[str, Any]]:
        return list(self.report.get("violations", []))

    @property
    def invariants_checked(self) -> int:
        return int(self.report.get("summary", {}).get("invariants_checked", 0))

    @property
    def violated_invariants(self) -> set[str]:
        return {v["invariant"] for v in self.violations}


def collect(command: Sequence[str], trace_dir: Path, run_id: str, timeout_s: float = 180.0) -> CollectResult:
    """Run one training command under ``trainwatch collect``; a stale trace dir is replaced."""
    if trace_dir.exists():
        for stale in trace_dir.iterdir():
            stale.unlink()
    trace_dir.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    for _attempt in range(2):
        try:
            proc = subprocess.run(
                [*TRAINWATCH, "collect", "-o", str(trace_dir), "--run-id", run_id, "--", *command],
                cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=timeout_s,
            )
            code, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            code, output = 124, f"timed out after {timeout_s:.0f}s: {exc}"
        # gloo can abort a rank at interpreter exit after training finished (with or
        # without trainwatch, more often on a loaded machine): that alone is run again
        if code == 0 or GLOO_TEARDOWN_ABORT not in output:
            break
        shutil.rmtree(trace_dir, ignore_errors=True)
    return CollectResult(trace_dir, code, time.monotonic() - started, output[-2000:])


def infer(trace_dirs: Sequence[Path], output: Path, timeout_s: float = 600.0) -> None:
    proc = subprocess.run(
        [*TRAINWATCH, "infer", *map(str, trace_dirs), "-o", str(output)],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=timeout_s,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"trainwatch infer failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")


def check(trace_dir: Path, report_path: Path, invariants: Path | None = None, timeout_s: float = 300.0) -> CheckResult:
    """``trainwatch check``; ``invariants=None`` means the shipped default set."""
    selection = ["-i", str(invariants)] if invariants is not None else []
    command = [*TRAINWATCH, "check", *selection, str(trace_dir), "--report-json", str(report_path)]
    report_path.unlink(missing_ok=True)
    proc = subprocess.run(command, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=timeout_s)
    # exit 2 with a report: the input was read, but a run had nothing to judge (it never trained)
    if proc.returncode not in (0, 1) and not (proc.returncode == 2 and report_path.is_file()):
        return CheckResult(proc.returncode, error=proc.stderr.strip()[-500:])
    return CheckResult(proc.returncode, json.loads(report_path.read_text(encoding="utf-8")),
                       error=proc.stderr.strip()[-500:] if proc.returncode == 2 else "")


def collect_with_traces(command: list[str], trace_dir: Path, run_id: str) -> CollectResult:
    """A run that leaves no trace would be scored as a clean twin or a missed bug: stop the
    benchmark with the collector's output (`collect` already ran a gloo teardown abort again)."""
    result = collect(command, trace_dir, run_id)
    if result.returncode != 0 or not any(trace_dir.glob("*.twtrace")):
        raise RuntimeError(f"{run_id}: no trace in {trace_dir} (exit {result.returncode}):\n{result.output_tail}")
    return result
