"""Work only some ranks do does not make replicas disagree.

Rank 0 evaluating, logging or checkpointing between iterations is everywhere in
data-parallel scripts. Cross-rank argument rules compare the i-th call of an API on
every rank; counting rank 0's evaluation calls shifted its training calls against the
other ranks' and reported a disagreement every time rank 0 evaluated.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from tests.support.teardown import run_program

PROGRAM = Path(__file__).resolve().parents[1] / "data" / "programs" / "ddp_rank0_eval.py"


def test_rank_zero_evaluating_alone_between_iterations_is_clean(tmp_path, clean_env):
    traces = tmp_path / "traces"
    collect = run_program(
        [sys.executable, "-m", "trainwatch.cli", "collect", "-o", str(traces), "--",
         sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(PROGRAM), "9", str(tmp_path)],
        timeout=240, env=clean_env)
    assert collect.returncode == 0, collect.stdout[-2000:] + collect.stderr[-3000:]
    check = subprocess.run([sys.executable, "-m", "trainwatch.cli", "check", str(traces)],
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "18 training iterations" in check.stdout
