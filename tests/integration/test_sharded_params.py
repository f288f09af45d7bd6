"""Parameters PyTorch shards itself (FSDP2's DTensors) are recorded from their local shard.

A DTensor is a wrapper whose own storage is empty: reading its bytes crashed the
training process (SIGSEGV), and reading its norms back failed. Its shard is what this
rank holds; shards differ across ranks by design, so they carry ``sharded`` and no
cross-rank rule judges them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from producers.digest import local_data, skip_reason
from producers.report import read_trace_dir
from tests.support.teardown import run_program

ROOT = Path(__file__).resolve().parents[2]


def test_the_wrapper_subclass_test_the_digest_relies_on_still_exists():
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    assert not is_traceable_wrapper_subclass(torch.ones(2))
    assert skip_reason(torch.ones(2)) is None and local_data(torch.ones(2)) is not None


def test_fsdp2_training_under_collect_records_shards_and_checks_clean(tmp_path, clean_env):
    traces = tmp_path / "traces"
    collect = run_program(
        [sys.executable, "-m", "trainwatch.cli", "collect", "-o", str(traces), "--",
         sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(ROOT / "examples" / "fsdp2_gloo.py"), "--steps", "4"],
        timeout=240, env=clean_env)
    assert collect.returncode == 0, collect.stdout[-2000:] + collect.stderr[-3000:]
    assert "internal error" not in collect.stderr
    runs = read_trace_dir(traces)
    states = [e for batches in runs.values() for b in batches for e in b["events"] if e["kind"] == "state"]
    stepped = [e["attrs"] for e in states if e["at"] == "post:torch.optim.Optimizer.step"]
    assert stepped and all(a["parallel"].get("sharded") is True for a in stepped)
    assert all(a["data_digest"] and a["data_norm"] is not None and "digest_skipped" not in a for a in stepped)
    check = subprocess.run([sys.executable, "-m", "trainwatch.cli", "check", str(traces)],
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
