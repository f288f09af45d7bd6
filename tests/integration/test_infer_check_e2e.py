"""End to end on real traces: collect healthy DDP runs, infer, check a healthy and a perturbed run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from invariants.invariant_file import loads
from tests.support.teardown import run_program

ROOT = Path(__file__).resolve().parents[2]
STEPS, PERTURB_STEP, PERTURB_RANK = 6, 3, 1
#: iteration K (1-based) is window K (window 0 is setup); the nudge after its optimizer
#: step is first seen by window K + 1
FIRST_WRONG_STEP = PERTURB_STEP + 1

pytestmark = pytest.mark.slow


def trainwatch(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess:
    return run_program([sys.executable, "-m", "trainwatch.cli", *args], env=env, cwd=ROOT, timeout=timeout)


def collect_ddp(out: Path, env: dict[str, str], *extra: str) -> Path:
    result = trainwatch("collect", "-o", str(out), "--", sys.executable, "-m", "torch.distributed.run",
                        "--nproc-per-node", "2", "examples/ddp_gloo.py", "--steps", str(STEPS), *extra, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(list(out.glob("*.twtrace"))) == 2
    return out


@pytest.fixture(scope="module")
def ddp_traces(tmp_path_factory):
    from os import environ

    env = {k: v for k, v in environ.items() if not k.startswith("TRAINWATCH_")}
    env["OMP_NUM_THREADS"] = "1"
    root = tmp_path_factory.mktemp("ddp")
    return {
        "env": env,
        "root": root,
        "reference": collect_ddp(root / "reference", env, "--seed", "0"),
        "healthy": collect_ddp(root / "healthy", env, "--seed", "1"),
        "broken": collect_ddp(root / "broken", env, "--seed", "1", "--perturb-rank", str(PERTURB_RANK),
                              "--perturb-step", str(PERTURB_STEP)),
    }


def test_infer_on_healthy_ddp_then_check_healthy_and_broken_runs(ddp_traces):
    env, root = ddp_traces["env"], ddp_traces["root"]
    invariants = root / "invariants.json"
    result = trainwatch("infer", str(ddp_traces["reference"]), "-o", str(invariants), env=env)
    assert result.returncode == 0, result.stderr
    learned = loads(invariants.read_text(), str(invariants))
    relations = {inv.relation for inv in learned}
    assert {"Consistent", "EventContain", "APISequence", "AllRanksReport"} <= relations
    cross_rank = [inv for inv in learned if inv.relation == "Consistent" and inv.params.get("scope") == "ranks"
                  and inv.params.get("attr") == "data_digest"]
    assert cross_rank, "no cross-rank weight consistency learned from a DDP run"

    healthy = trainwatch("check", "-i", str(invariants), str(ddp_traces["healthy"]), env=env)
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert healthy.stdout.startswith("OK: no violation")

    report = root / "broken.json"
    broken = trainwatch("check", "-i", str(invariants), str(ddp_traces["broken"]), "--report-json", str(report), env=env)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert broken.stdout.startswith(f"VIOLATION at step {FIRST_WRONG_STEP} ")
    data = json.loads(report.read_text())
    assert data["summary"]["first_violation_step"] == FIRST_WRONG_STEP
    first = [v for v in data["violations"] if v["step"] == FIRST_WRONG_STEP]
    assert all(v["relation"] == "Consistent" for v in first)
    assert any(v["evidence"]["first"]["variable"] == "module.0.weight" for v in first)
    assert all(v["step"] >= FIRST_WRONG_STEP for v in data["violations"])


def test_shipped_default_set_catches_the_perturbed_replica(ddp_traces):
    env = ddp_traces["env"]
    assert trainwatch("check", str(ddp_traces["healthy"]), env=env).returncode == 0
    broken = trainwatch("check", str(ddp_traces["broken"]), env=env)
    assert broken.returncode == 1
    assert f"VIOLATION at step {FIRST_WRONG_STEP} " in broken.stdout
    assert "identical on all data-parallel ranks" in broken.stdout
