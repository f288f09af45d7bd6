"""A teacher that averages the student's parameters but not its BatchNorm buffers is
evaluated on the learned scale and shift with the initial statistics (mean 0, variance
1): its evaluation-mode forwards break ``evaluates_fitted_norm``.  Averaging the buffers
too, evaluating the trained student, and evaluating a model before it trained keep the
contract or are not judged."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import producers
from invariants.events import MODULE_FORWARD
from tests.support.producer_traces import trace_batches, trace_events

CONTRACT = "evaluates_fitted_norm"


def _verdicts(tmp_path, mtype: str = "BatchNorm1d") -> list:
    return [((event.get("ctx") or {}).get("contract") or {}).get(CONTRACT)
            for _, event in trace_events(trace_batches(tmp_path))
            if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == MODULE_FORWARD
            and event.get("mtype") == mtype]


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


def _train_with_teacher(tmp_path, *, with_buffers: bool) -> None:
    torch.manual_seed(0)
    student = _model()
    optimizer = torch.optim.SGD(student.parameters(), lr=0.1)
    with producers.instrument(run_id="r-teacher", trace_dir=tmp_path, quiet=True):
        teacher = None
        for step in range(6):
            student.train()
            optimizer.zero_grad()
            nn.functional.cross_entropy(student(torch.randn(16, 4)), torch.randint(0, 2, (16,))).backward()
            optimizer.step()
            if step == 2:
                teacher = _model()  # a fresh instance: mean-teacher's create_model(ema=True)
            if teacher is not None:
                with torch.no_grad():
                    for averaged, param in zip(teacher.parameters(), student.parameters()):
                        averaged.mul_(0.5).add_(param, alpha=0.5)
                    if with_buffers:
                        for averaged, buffer in zip(teacher.buffers(), student.buffers()):
                            averaged.copy_(buffer)
                teacher.eval()
                with torch.no_grad():
                    teacher(torch.randn(16, 4))


@pytest.mark.parametrize("with_buffers", [False, True])
def test_a_teacher_averaging_parameters_only_breaks_it_and_one_with_buffers_keeps_it(tmp_path, with_buffers):
    _train_with_teacher(tmp_path, with_buffers=with_buffers)
    verdicts = [verdict for verdict in _verdicts(tmp_path) if verdict is not None]
    assert len(verdicts) == 4
    assert set(verdicts) == ({True} if with_buffers else {False})


def test_the_trained_student_and_an_untrained_model_are_fine_or_not_judged(tmp_path):
    torch.manual_seed(0)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with producers.instrument(run_id="r-student", trace_dir=tmp_path, quiet=True):
        model.eval()
        with torch.no_grad():
            model(torch.randn(16, 4))  # a sanity check before training: initial weights
        for _ in range(3):
            model.train()
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(torch.randn(16, 4)), torch.randint(0, 2, (16,))).backward()
            optimizer.step()
            model.eval()
            with torch.no_grad():
                model(torch.randn(16, 4))
        untouched = copy.deepcopy(model)
        untouched.load_state_dict({name: tensor for name, tensor in model.state_dict().items()})
        untouched.eval()
        with torch.no_grad():
            untouched(torch.randn(16, 4))
    assert _verdicts(tmp_path) == [None, None, True, None, True, None, True, True]
