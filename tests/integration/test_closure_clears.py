"""LBFGS evaluates its closure several times per step: a closure that does not clear
the gradients before its backward hands the line search gradients summed over every
evaluation (Lightning#4083).  ``clears_between_evaluations`` breaks at the backwards of
the second and later evaluations of such a step; clearing inside the closure keeps it,
and the first evaluation and one-evaluation optimizers are not judged."""

from __future__ import annotations

import torch
from torch import nn

import producers
from invariants.events import TENSOR_BACKWARD
from tests.support.producer_traces import trace_batches, trace_events

CONTRACT = "clears_between_evaluations"


def _verdicts(tmp_path) -> list:
    return [((event.get("ctx") or {}).get("contract") or {}).get(CONTRACT)
            for _, event in trace_events(trace_batches(tmp_path))
            if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == TENSOR_BACKWARD]


def _fit(optimizer_of, clear_inside: bool, steps: int = 2) -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    inputs, targets = torch.randn(16, 3), torch.randn(16, 1)
    optimizer = optimizer_of(model.parameters())
    for _ in range(steps):
        if not clear_inside:
            optimizer.zero_grad()

        def closure():
            if clear_inside:
                optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(inputs), targets)
            loss.backward()
            return loss

        optimizer.step(closure)


def lbfgs(params):
    return torch.optim.LBFGS(params, max_iter=3, tolerance_grad=0.0, tolerance_change=0.0)


def test_a_closure_that_does_not_clear_breaks_it_from_the_second_evaluation(tmp_path):
    with producers.instrument(run_id="r-closure", trace_dir=tmp_path, quiet=True):
        _fit(lbfgs, clear_inside=False)
    assert _verdicts(tmp_path) == [None, False, False] * 2


def test_clearing_inside_the_closure_keeps_it_and_single_evaluations_are_not_judged(tmp_path):
    with producers.instrument(run_id="r-closure-ok", trace_dir=tmp_path, quiet=True):
        _fit(lbfgs, clear_inside=True)
        _fit(lambda params: torch.optim.SGD(params, lr=0.1), clear_inside=False)
    assert _verdicts(tmp_path) == [None, True, True] * 2 + [None] * 2
