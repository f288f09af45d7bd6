"""Uneven inputs under ``Join``: the iterations a rank shadows are windows of its own,
so step numbers stay aligned across ranks and the run with ZeroRedundancyOptimizer (its
join hook steps the shard in each shadowed iteration) is clean; with DDP alone and a
stateful optimizer, the early rank's skipped updates make the replicas drift, and that
is reported.  An optimizer stepped inside another's step is part of the outer step."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join, Joinable, JoinHook
from torch.nn import functional as F

import producers
from invariants.events import OPTIMIZER_STEP
from tests.support.producer_traces import trace_batches, trace_events
from tests.support.teardown import run_program

PROGRAM = Path(__file__).resolve().parents[1] / "data" / "programs" / "ddp_join_uneven.py"


def _collect_and_check(tmp_path, clean_env, mode: str) -> tuple[str, subprocess.CompletedProcess]:
    traces = tmp_path / "traces"
    collect = run_program(
        [sys.executable, "-m", "trainwatch.cli", "collect", "-o", str(traces), "--",
         sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(PROGRAM), mode],
        timeout=240, env=clean_env)
    assert collect.returncode == 0, collect.stdout[-2000:] + collect.stderr[-3000:]
    check = subprocess.run([sys.executable, "-m", "trainwatch.cli", "check", str(traces)],
                           capture_output=True, text=True, timeout=120)
    return collect.stdout + collect.stderr, check


@pytest.mark.slow
def test_zero_under_join_with_uneven_inputs_is_clean_and_aligned(tmp_path, clean_env):
    output, check = _collect_and_check(tmp_path, clean_env, "zero")
    assert "rank 1 largest difference from rank 0: 0.0e+00" in output
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-2000:]
    # rank 0 trains 6 iterations an epoch, rank 1 trains 4 and shadows 2, for 3 epochs:
    # both number 18 iteration windows (and setup, and the end), the shadowed 6 untrained
    assert "iterations 18, 12" in check.stdout
    assert "checked 20 step windows" in check.stdout
    assert int(re.search(r"(\d+) windows without training", check.stdout).group(1)) >= 6


@pytest.mark.slow
def test_ddp_alone_under_join_with_a_stateful_optimizer_drifts_and_is_reported(tmp_path, clean_env):
    output, check = _collect_and_check(tmp_path, clean_env, "adamw")
    assert "rank 1 largest difference from rank 0: 0.0e+00" not in output
    assert check.returncode == 1, check.stdout[-3000:] + check.stderr[-2000:]
    assert "identical on all data-parallel ranks" in check.stdout


class _Quiet(Joinable):
    def __init__(self) -> None:
        super().__init__()

    def join_hook(self, **kwargs) -> JoinHook:
        return JoinHook()

    @property
    def join_device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def join_process_group(self):
        return dist.group.WORLD


def test_what_this_relies_on_join_keeps_its_main_hooks_in_a_list(tmp_path):
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        join = Join([_Quiet()])
        assert isinstance(join._join_hooks, list) and all(isinstance(h, JoinHook) for h in join._join_hooks)
        with producers.instrument(run_id="r-join", trace_dir=tmp_path, quiet=True):
            with Join([_Quiet()]):
                pass  # the only rank: nothing to shadow, and the patched exit returns
    finally:
        dist.destroy_process_group()


class _Lookahead(torch.optim.Optimizer):
    """A wrapper optimizer in the style of Lookahead: its step runs its base's step."""

    def __init__(self, base: torch.optim.Optimizer) -> None:
        self.base = base
        super().__init__(base.param_groups, {})
        self.param_groups = base.param_groups

    def step(self, closure=None):
        return self.base.step(closure)


def test_an_optimizer_stepped_inside_another_ones_step_is_part_of_it(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = _Lookahead(torch.optim.SGD(model.parameters(), lr=0.1))
    with producers.instrument(run_id="r-nested", trace_dir=tmp_path, quiet=True):
        for _ in range(4):
            optimizer.zero_grad()
            F.mse_loss(model(torch.randn(8, 4)), torch.randn(8, 2)).backward()
            optimizer.step()
    steps = [event for _, event in trace_events(trace_batches(tmp_path))
             if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == OPTIMIZER_STEP]
    assert [step["name"].rsplit(".", 2)[-2] for step in steps] == ["_Lookahead"] * 4


def test_a_step_of_another_optimizer_made_inside_a_closure_is_the_users_own(tmp_path):
    torch.manual_seed(0)
    generator, critic = nn.Linear(4, 4), nn.Linear(4, 1)
    generator_optimizer = torch.optim.SGD(generator.parameters(), lr=0.1)
    critic_optimizer = torch.optim.SGD(critic.parameters(), lr=0.1)

    def closure():
        critic_optimizer.zero_grad()
        critic(generator(torch.randn(8, 4)).detach()).mean().backward()
        critic_optimizer.step()  # the critic steps inside the generator's closure
        generator_optimizer.zero_grad()
        loss = -critic(generator(torch.randn(8, 4))).mean()
        loss.backward()
        return loss

    with producers.instrument(run_id="r-closure", trace_dir=tmp_path, quiet=True):
        for _ in range(3):
            generator_optimizer.step(closure)
    steps = [event for _, event in trace_events(trace_batches(tmp_path))
             if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == OPTIMIZER_STEP]
    assert sorted(step["obj"] for step in steps) == ["opt0"] * 3 + ["opt1"] * 3
