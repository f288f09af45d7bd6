"""Ranks that never synchronise gradients train separate models on purpose (federated
averaging, ensembles): cross-rank rules on parameters leave them out, and the rank
that ends its run first is not reported missing from the steps it never took.  A
hand-written data-parallel loop that reduces gradients is judged as replicas, and its
rank that stops reducing is reported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.teardown import run_program

pytestmark = pytest.mark.slow

PROGRAM = Path(__file__).resolve().parents[1] / "data" / "programs" / "dist_local_models.py"


def _collect_and_check(tmp_path, clean_env, *args: str) -> subprocess.CompletedProcess:
    traces = tmp_path / "traces"
    collect = run_program(
        [sys.executable, "-m", "trainwatch.cli", "collect", "-o", str(traces), "--",
         sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(PROGRAM), *args],
        timeout=240, env=clean_env)
    assert collect.returncode == 0, collect.stdout[-2000:] + collect.stderr[-3000:]
    return subprocess.run([sys.executable, "-m", "trainwatch.cli", "check", str(traces)],
                          capture_output=True, text=True, timeout=120)


def test_federated_ranks_averaging_parameters_per_round_are_clean(tmp_path, clean_env):
    check = _collect_and_check(tmp_path, clean_env, "federated")
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-2000:]
    # rank 0 trains 3 rounds of 4 steps, rank 1 of 6
    assert "30 training iterations" in check.stdout
    # the verdict says what it did not compare
    assert "2 ranks never synchronised gradients" in check.stdout


def test_a_hand_written_data_parallel_loop_is_judged_as_replicas(tmp_path, clean_env):
    check = _collect_and_check(tmp_path, clean_env, "manual-dp")
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-2000:]
    assert "never synchronised" not in check.stdout
    broken = _collect_and_check(tmp_path / "broken", clean_env, "manual-dp", "--skip-reduce", "6")
    assert broken.returncode == 1, broken.stdout[-3000:] + broken.stderr[-2000:]
    assert "identical on all data-parallel ranks" in broken.stdout
