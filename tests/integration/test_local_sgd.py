"""Post-local SGD lets replicas differ between averagings on purpose: from the
iteration its DDP hook starts local steps, the parameters' snapshots carry the
not-all-reduced mark and cross-rank rules leave them out, so the run is clean. Plain
DDP whose replica drifts is still reported, and the mark is absent there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.teardown import run_program

pytestmark = pytest.mark.slow

PROGRAM = Path(__file__).resolve().parents[1] / "data" / "programs" / "ddp_post_local_sgd.py"
STEPS = 12


def _collect_and_check(tmp_path, clean_env, *flags: str) -> subprocess.CompletedProcess:
    traces = tmp_path / "traces"
    collect = run_program(
        [sys.executable, "-m", "trainwatch.cli", "collect", "-o", str(traces), "--",
         sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(PROGRAM), str(STEPS), *flags],
        timeout=240, env=clean_env)
    assert collect.returncode == 0, collect.stdout[-2000:] + collect.stderr[-3000:]
    return subprocess.run([sys.executable, "-m", "trainwatch.cli", "check", str(traces)],
                          capture_output=True, text=True, timeout=120)


def test_post_local_sgd_replicas_differing_between_averagings_are_clean(tmp_path, clean_env):
    check = _collect_and_check(tmp_path, clean_env)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-2000:]
    assert f"{2 * STEPS} training iterations" in check.stdout


def test_plain_ddp_with_a_drifting_replica_is_still_reported(tmp_path, clean_env):
    check = _collect_and_check(tmp_path, clean_env, "--broken-average")
    assert check.returncode == 1, check.stdout[-3000:] + check.stderr[-2000:]
    assert "identical on all data-parallel ranks" in check.stdout
