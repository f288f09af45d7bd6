"""A clip run on every micro-batch of an accumulation cycle rescales partial sums once
they exceed the bound, and later micro-batches are added at full weight
(accelerate#641): ``clips_whole_cycles`` breaks at that step.  A clip after the cycle's
last backward, clips that rescale nothing, a clip per model before two optimizers step
and a skipped step whose clear drops the partial sums keep it or are not judged."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import producers
from invariants.events import OPTIMIZER_STEP
from tests.support.producer_traces import trace_batches, trace_events

CONTRACT = "clips_whole_cycles"


def _verdicts(tmp_path) -> list:
    return [((event.get("ctx") or {}).get("contract") or {}).get(CONTRACT, "absent")
            for _, event in trace_events(trace_batches(tmp_path))
            if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == OPTIMIZER_STEP]


def _accumulate(tmp_path, *, clip_each: bool, bound: float, scale_from: int = 0) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with producers.instrument(run_id="r-partial", trace_dir=tmp_path, quiet=True):
        for step in range(4):
            scale = 100.0 if step >= scale_from else 0.001
            for micro in range(3):
                (model(torch.randn(8, 4)).pow(2).mean() * scale).backward()
                if clip_each or micro == 2:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), bound)
            optimizer.step()
            optimizer.zero_grad()


def test_clipping_each_micro_batch_breaks_the_contract_once_a_partial_sum_is_rescaled(tmp_path):
    _accumulate(tmp_path, clip_each=True, bound=1.0, scale_from=2)
    assert _verdicts(tmp_path) == [True, True, False, False]


@pytest.mark.parametrize("clip_each, bound", [(False, 1.0), (True, 1e9)])
def test_a_clip_per_cycle_or_clips_that_rescale_nothing_keep_it(tmp_path, clip_each, bound):
    _accumulate(tmp_path, clip_each=clip_each, bound=bound)
    assert _verdicts(tmp_path) == [True] * 4


def test_a_clip_per_model_before_two_optimizers_step_keeps_it(tmp_path):
    first, second = nn.Linear(4, 1), nn.Linear(4, 1)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.01) for m in (first, second)]
    with producers.instrument(run_id="r-partial-two", trace_dir=tmp_path, quiet=True):
        for _ in range(3):
            (first(torch.randn(8, 4)).pow(2).mean() * 100).backward()
            torch.nn.utils.clip_grad_norm_(first.parameters(), 1.0)
            (second(torch.randn(8, 4)).pow(2).mean() * 100).backward()
            torch.nn.utils.clip_grad_norm_(second.parameters(), 1.0)
            for optimizer in optimizers:
                optimizer.step()
                optimizer.zero_grad()
    assert False not in _verdicts(tmp_path)
