"""``resumes_trained_parameters``: an optimizer's first step after a resume steps only
parameters the checkpoint held state for, or ones frozen at the resume and unfrozen
since.  A resume that rebuilds the model and forgets to freeze its encoder again
(transformers#11294) breaks it; the fixed resume, an unfreeze scheduled at the epoch the
run resumes in, and a checkpoint without optimizer state keep it or are not judged."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import producers
from invariants.events import OPTIMIZER_STEP
from tests.support.producer_traces import trace_batches, trace_events


def _verdicts(tmp_path) -> list:
    return [((event.get("ctx") or {}).get("contract") or {}).get("resumes_trained_parameters")
            for _, event in trace_events(trace_batches(tmp_path))
            if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == OPTIMIZER_STEP]


def _build(freeze: bool) -> nn.Module:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    if freeze:
        model[0].requires_grad_(False)  # the encoder
    return model


def _steps(model: nn.Module, optimizer: torch.optim.Optimizer, count: int) -> None:
    for _ in range(count):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()


def _resume(tmp_path, *, refreeze: bool, unfreeze_after: bool = False, optimizer_type=torch.optim.AdamW) -> None:
    torch.manual_seed(0)
    with producers.instrument(run_id="r-resume-freeze", trace_dir=tmp_path, quiet=True):
        model = _build(freeze=True)
        optimizer = optimizer_type(model.parameters(), lr=1e-2)  # every parameter, the frozen ones too
        _steps(model, optimizer, 3)
        checkpoint = {"model": copy.deepcopy(model.state_dict()), "optimizer": copy.deepcopy(optimizer.state_dict())}
        model = _build(freeze=refreeze)  # the restarted job
        model.load_state_dict(checkpoint["model"])
        optimizer = optimizer_type(model.parameters(), lr=1e-2)
        optimizer.load_state_dict(checkpoint["optimizer"])
        if unfreeze_after:
            model[0].requires_grad_(True)  # the schedule unfreezes in the epoch the run resumes in
        _steps(model, optimizer, 2)


def test_a_resume_that_forgets_the_freeze_breaks_the_contract_at_its_first_step(tmp_path):
    _resume(tmp_path, refreeze=False)
    assert _verdicts(tmp_path) == [None, None, None, False, None]


@pytest.mark.parametrize("unfreeze_after", [False, True])
def test_a_resume_that_freezes_again_keeps_the_contract(tmp_path, unfreeze_after):
    _resume(tmp_path, refreeze=True, unfreeze_after=unfreeze_after)
    assert _verdicts(tmp_path) == [None, None, None, True, None]


def test_a_checkpoint_without_optimizer_state_is_not_judged(tmp_path):
    _resume(tmp_path, refreeze=False, optimizer_type=torch.optim.SGD)
    assert set(_verdicts(tmp_path)) == {None}
