"""`collect --overhead-budget`: snapshots are thinned to fit, and nobody is left to guess —
the step ends say which windows have none, producer_stats and the collect summary give
the budget and the measured share, and `check`'s coverage line repeats them."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from producers.report import read_trace_batches
from tests.support.teardown import run_program

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = textwrap.dedent("""
    import torch
    from torch import nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(40):
        optimizer.zero_grad()
        model(torch.randn(8, 16)).pow(2).mean().backward()
        optimizer.step()
""")


def _trainwatch(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return run_program([sys.executable, "-m", "trainwatch.cli", *args], env=env, cwd=ROOT, timeout=180)


def test_a_budget_thins_snapshots_and_every_report_says_so(tmp_path, clean_env):
    script = tmp_path / "train.py"
    script.write_text(PROGRAM)
    traces = tmp_path / "traces"
    collected = _trainwatch(["collect", "--overhead-budget", "0.05", "-o", str(traces), "--",
                             sys.executable, str(script)], clean_env)
    assert collected.returncode == 0, collected.stderr
    assert "overhead budget 5.0%: snapshots in" in collected.stderr

    (trace,) = traces.glob("*.twtrace")
    batches = read_trace_batches(trace)
    windows: dict[int, dict] = {}
    for batch in batches:
        window = windows.setdefault(batch["step"], {"states": 0, "end": None})
        for event in batch["events"]:
            window["states"] += event["kind"] == "state"
            if event["kind"] == "step" and event["phase"] == "end":
                window["end"] = event
    iterations = [w for w in windows.values() if w["end"] and w["end"].get("trained")]
    unsampled = [w for w in iterations if w["end"].get("unsampled")]
    assert unsampled and len(unsampled) < len(iterations)  # thinned, not switched off
    assert all(w["states"] == 0 for w in unsampled)
    assert all(w["states"] > 0 for w in iterations if not w["end"].get("unsampled"))
    stats = [e for b in batches for e in b["events"] if e["kind"] == "meta" and e.get("what") == "producer_stats"]
    assert stats and stats[-1]["overhead_budget"] == 0.05 and 0 < stats[-1]["overhead_share"] < 1

    checked = _trainwatch(["check", str(traces)], clean_env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"{len(unsampled)} iterations without parameter snapshots (overhead budget 5.0%, producer share " \
           "measured" in checked.stdout


def test_an_impossible_budget_is_refused_in_one_line(tmp_path, clean_env):
    result = _trainwatch(["collect", "--overhead-budget", "1.5", "-o", str(tmp_path / "t"), "--",
                          sys.executable, "-c", "pass"], clean_env)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "between 0 and 1" in result.stderr
