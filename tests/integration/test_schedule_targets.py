"""``schedules_stepping_optimizer``: every optimizer a learning-rate schedule stepped since
the previous optimizer step is one training still steps.  A scheduler restored with a
pickled copy of its optimizer (pytorch-gradual-warmup-lr issue 27) or kept over an
optimizer that was rebuilt breaks it; a generator's schedule stepped before the
generator's first step and a wrapper sharing the optimizer's groups keep it."""

from __future__ import annotations

import copy

import torch
from torch import nn

import producers
from invariants.events import OPTIMIZER_STEP
from tests.support.producer_traces import trace_batches, trace_events


def _verdicts(tmp_path, obj: str | None = None) -> list:
    return [((event.get("ctx") or {}).get("contract") or {}).get("schedules_stepping_optimizer")
            for _, event in trace_events(trace_batches(tmp_path))
            if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == OPTIMIZER_STEP
            and obj in (None, event.get("obj"))]


def _step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    optimizer.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    optimizer.step()


def test_a_schedule_over_a_copy_of_the_optimizer_is_reported(tmp_path):
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with producers.instrument(run_id="r-copy", trace_dir=tmp_path, quiet=True):
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        for index in range(6):
            if index == 3:  # restored from a checkpoint that pickled the optimizer with it
                schedule = torch.optim.lr_scheduler.StepLR(copy.deepcopy(optimizer), step_size=1, gamma=0.5)
            _step(model, optimizer)
            schedule.step()
    assert _verdicts(tmp_path) == [True, True, True, False, False, False]  # from the copy's constructor step on


def test_a_schedule_kept_over_a_rebuilt_optimizer_is_reported(tmp_path):
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with producers.instrument(run_id="r-rebuilt", trace_dir=tmp_path, quiet=True):
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        for index in range(6):
            if index == 3:  # e.g. after an unfreeze; the schedule still drives the old one
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            _step(model, optimizer)
            schedule.step()
    # the step at index 3 is the new optimizer's first: the schedule's step before it came
    # after the old optimizer's last step, as a finished stage's last schedule step does
    assert _verdicts(tmp_path) == [True, True, True, True, False, False]


def test_a_finished_stages_last_schedule_step_is_fine(tmp_path):
    """Two stages over the same model (Hugging Face ``Trainer`` twice, Lightning ``fit``
    twice): the first stage's schedule steps after its optimizer's last step."""
    model = nn.Linear(4, 1)
    with producers.instrument(run_id="r-stages", trace_dir=tmp_path, quiet=True):
        for _stage in range(2):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
            for _ in range(3):
                _step(model, optimizer)
                schedule.step()
    assert _verdicts(tmp_path) == [True] * 6


def test_a_new_stages_schedule_before_its_optimizers_first_step_is_fine(tmp_path):
    """SRGAN: a pre-training optimizer over the generator steps first; the adversarial
    stage's optimizers and schedules are built after it (their constructors step them)."""
    generator, critic = nn.Linear(4, 4), nn.Linear(4, 1)
    with producers.instrument(run_id="r-pretrain", trace_dir=tmp_path, quiet=True):
        pretrain = torch.optim.Adam(generator.parameters())
        for _ in range(3):
            _step(generator, pretrain)
        opt_c, opt_g = torch.optim.Adam(critic.parameters()), torch.optim.Adam(generator.parameters())
        schedules = [torch.optim.lr_scheduler.StepLR(opt, step_size=2) for opt in (opt_c, opt_g)]
        for _ in range(3):
            opt_c.zero_grad()
            critic(generator(torch.randn(8, 4)).detach()).mean().backward()
            opt_c.step()
            _step(lambda x: critic(generator(x)), opt_g)
            for schedule in schedules:
                schedule.step()
    assert False not in _verdicts(tmp_path)


def test_a_generator_schedule_before_its_first_step_and_a_wrapper_keep_it(tmp_path):
    generator, critic = nn.Linear(4, 4), nn.Linear(4, 1)
    opt_g = torch.optim.Adam(generator.parameters())
    opt_c = torch.optim.Adam(critic.parameters())
    wrapper = torch.optim.SGD([{"params": []}], lr=0.1)
    wrapper.param_groups = opt_c.param_groups  # a wrapper stepping the critic's own groups
    sched_g = torch.optim.lr_scheduler.LinearLR(opt_g, start_factor=0.5, total_iters=10)
    sched_c = torch.optim.lr_scheduler.LinearLR(wrapper, start_factor=0.5, total_iters=10)
    with producers.instrument(run_id="r-gan", trace_dir=tmp_path, quiet=True):
        for index in range(8):
            opt_c.zero_grad()
            critic(generator(torch.randn(8, 4)).detach()).mean().backward()
            opt_c.step()
            if index % 4 == 3:
                opt_g.zero_grad()
                (-critic(generator(torch.randn(8, 4)))).mean().backward()
                opt_g.step()
            sched_g.step()
            sched_c.step()
    assert False not in _verdicts(tmp_path)
    assert True in _verdicts(tmp_path)
