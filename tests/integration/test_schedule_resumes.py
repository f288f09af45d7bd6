"""A resume that restores the optimizer but not its scheduler starts the schedule over:
the scheduler's first step after the resume breaks ``resumes_schedule``.  Restoring the
scheduler's state, building it at the resumed epoch, a checkpoint taken before the
scheduler's first step, a fresh run, and an optimizer without state keep it."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.optim import lr_scheduler

import producers
from invariants.events import SCHEDULER_STEP
from tests.support.producer_traces import trace_batches, trace_events


def _verdicts(tmp_path) -> list:
    contracts = [(event.get("ctx") or {}).get("contract") or {} for _, event in trace_events(trace_batches(tmp_path))
                 if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == SCHEDULER_STEP]
    return [contract.get("resumes_schedule", "absent") for contract in contracts]


def _objects(momentum: float = 0.9, last_epoch: int = -1):
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)
    if last_epoch >= 0:
        for group in optimizer.param_groups:
            group.setdefault("initial_lr", group["lr"])
    scheduler = lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 4), last_epoch=last_epoch)
    return model, optimizer, scheduler


def _train(model, optimizer, scheduler, steps: int, schedule: bool = True) -> None:
    for _ in range(steps):
        F.mse_loss(model(torch.randn(8, 4)), torch.randn(8, 1)).backward()
        optimizer.step()
        optimizer.zero_grad()
        if schedule:
            scheduler.step()


def _resume(tmp_path, how: str, momentum: float = 0.9) -> list:
    model, optimizer, scheduler = _objects(momentum)
    with producers.instrument(run_id="r-resume", trace_dir=tmp_path, quiet=True):
        _train(model, optimizer, scheduler, 5)
        saved = (model.state_dict(), optimizer.state_dict(), scheduler.state_dict())
        if how == "built_at_epoch":
            model, optimizer, _ = _objects(momentum)
            model.load_state_dict(saved[0])
            optimizer.load_state_dict(saved[1])
            scheduler = lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 4), last_epoch=4)
        else:
            model, optimizer, scheduler = _objects(momentum)
            model.load_state_dict(saved[0])
            optimizer.load_state_dict(saved[1])
            if how == "scheduler_loaded":
                scheduler.load_state_dict(saved[2])
        _train(model, optimizer, scheduler, 3)
    return _verdicts(tmp_path)


def test_a_resume_without_the_schedulers_state_breaks_the_contract_once(tmp_path):
    # the new scheduler's constructor takes a step of its own, not judged
    assert _resume(tmp_path, "optimizer_only") == [True] * 5 + ["absent", False, True, True]


@pytest.mark.parametrize("how", ["scheduler_loaded", "built_at_epoch"])
def test_a_resume_that_restores_the_schedule_keeps_it(tmp_path, how):
    verdicts = _resume(tmp_path, how)
    assert verdicts[:6] == [True] * 5 + ["absent"] and set(verdicts[6:]) == {True}


def test_an_optimizer_without_state_was_not_resumed(tmp_path):
    assert _resume(tmp_path, "optimizer_only", momentum=0.0) == [True] * 5 + ["absent", True, True, True]


def test_a_checkpoint_taken_before_the_schedulers_first_step_restores_epoch_zero(tmp_path):
    model, optimizer, scheduler = _objects()
    with producers.instrument(run_id="r-resume", trace_dir=tmp_path, quiet=True):
        _train(model, optimizer, scheduler, 3, schedule=False)  # a per-epoch schedule, mid-epoch checkpoint
        saved = (optimizer.state_dict(), scheduler.state_dict())
        _, optimizer, scheduler = _objects()
        optimizer.load_state_dict(saved[0])
        scheduler.load_state_dict(saved[1])
        scheduler.step()
    assert _verdicts(tmp_path) == ["absent", True]  # the constructor's step, then the judged one
