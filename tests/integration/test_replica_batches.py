"""Data-parallel replicas train on batches of their own: the optimizer step of each
rank carries a digest of the DataLoader batches it trains on (`batch_digest`), which
differs across ranks under a ``DistributedSampler`` and agrees from the first step
whose ranks draw the same batches (a plain sampler seeded alike on every rank)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from invariants.events import OPTIMIZER_STEP
from trainwatch.tracedir import read_trace_dir
from tests.support.teardown import run_program

pytestmark = pytest.mark.slow

PROGRAM = Path(__file__).resolve().parents[1] / "data" / "programs" / "ddp_shared_sampler.py"
STEPS_PER_EPOCH = 4


def _digests_by_step(tmp_path, clean_env, shape: str) -> dict[int, dict[int, str]]:
    traces = tmp_path / "traces"
    collect = run_program(
        [sys.executable, "-m", "trainwatch.cli", "collect", "-o", str(traces), "--",
         sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(PROGRAM), shape],
        timeout=240, env=clean_env)
    assert collect.returncode == 0, collect.stdout[-2000:] + collect.stderr[-3000:]
    found: dict[int, dict[int, str]] = {}
    for batch in read_trace_dir(traces):
        for event in batch["events"]:
            if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == OPTIMIZER_STEP:
                digest = (event.get("args") or {}).get("batch_digest")
                if digest is not None:
                    found.setdefault(batch["step"], {})[batch["rank"]] = digest
    return found


def test_ranks_drawing_the_same_batches_carry_the_same_digest_from_the_onset(tmp_path, clean_env):
    digests = _digests_by_step(tmp_path, clean_env, "same-batches")
    shared = sorted(step for step, by_rank in digests.items() if len(by_rank) == 2 and len(set(by_rank.values())) == 1)
    apart = sorted(step for step, by_rank in digests.items() if len(by_rank) == 2 and len(set(by_rank.values())) == 2)
    assert shared and apart
    assert max(apart) < min(shared)
    assert len(shared) == 2 * STEPS_PER_EPOCH


def test_sharded_ranks_never_share_a_digest(tmp_path, clean_env):
    digests = _digests_by_step(tmp_path, clean_env, "sharded")
    judged = [by_rank for by_rank in digests.values() if len(by_rank) == 2]
    assert len(judged) >= 3 * STEPS_PER_EPOCH - 1
    assert all(len(set(by_rank.values())) == 2 for by_rank in judged)
