"""Weights swapped in for an evaluation (EMA weights copied into the live model) and not
swapped back make the next optimizer step break ``keeps_weights_after_eval``.  A swap
that is restored, an evaluation that changes nothing, loops that change weights between
every two steps anyway (WGAN clipping) and a resume that restores the optimizer's
state as well keep the contract or are not judged."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import producers
from invariants.events import OPTIMIZER_STEP
from producers import readback
from tests.support.producer_traces import trace_batches, trace_events


def _verdicts(tmp_path) -> list:
    """The contract of each optimizer step, in order (None: not judged)."""
    return [((event.get("ctx") or {}).get("contract") or {}).get("keeps_weights_after_eval")
            for _, event in trace_events(trace_batches(tmp_path))
            if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == OPTIMIZER_STEP]


def _train_evaluate_train(tmp_path, between_evaluation, after_step=None) -> list:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    shadow = [p.detach().clone() for p in model.parameters()]

    def step():
        optimizer.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()
        if after_step is not None:
            after_step(model)
        with torch.no_grad():
            for averaged, p in zip(shadow, model.parameters()):
                averaged.lerp_(p, 0.1)

    with producers.instrument(run_id="r-eval", trace_dir=tmp_path, quiet=True):
        model.train()
        for _ in range(4):
            step()
        between_evaluation(model, optimizer, shadow)
        model.train()
        for _ in range(2):
            step()
    return _verdicts(tmp_path)


def _evaluate(model: nn.Module) -> None:
    model.eval()
    with torch.no_grad():
        model(torch.randn(8, 4))


def test_ema_weights_copied_in_for_evaluation_and_never_restored_break_the_contract(tmp_path):
    def swap_in(model, optimizer, shadow):
        for p, averaged in zip(model.parameters(), shadow):
            p.data.copy_(averaged)  # diffusers' EMAModel.copy_to without store()/restore()
        _evaluate(model)

    assert _train_evaluate_train(tmp_path, swap_in) == [None] * 4 + [False, None]


def test_a_restored_swap_and_an_evaluation_that_changes_nothing_keep_the_contract(tmp_path):
    def swap_and_restore(model, optimizer, shadow):
        backup = [p.detach().clone() for p in model.parameters()]
        with torch.no_grad():
            for p, averaged in zip(model.parameters(), shadow):
                p.copy_(averaged)
        _evaluate(model)
        with torch.no_grad():
            for p, kept in zip(model.parameters(), backup):
                p.copy_(kept)

    assert _train_evaluate_train(tmp_path, swap_and_restore) == [None] * 4 + [True, None]
    assert _train_evaluate_train(tmp_path / "plain", lambda model, *_: _evaluate(model)) == [None] * 4 + [True, None]


def test_weights_changed_between_every_step_or_restored_with_the_optimizer_state_are_not_judged(tmp_path):
    def clip(model):
        with torch.no_grad():
            for p in model.parameters():
                p.clamp_(-0.05, 0.05)  # WGAN weight clipping after each step

    assert set(_train_evaluate_train(tmp_path, lambda model, *_: _evaluate(model), after_step=clip)) == {None}

    def resume(model, optimizer, shadow):
        checkpoint = {"model": {k: v + 1 for k, v in model.state_dict().items()}, "optimizer": optimizer.state_dict()}
        _evaluate(model)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])

    assert set(_train_evaluate_train(tmp_path / "resume", resume)) == {None}


@pytest.mark.parametrize("deferred", [False, True], ids=["immediate", "read-back-later"])
def test_weights_changed_every_few_steps_are_not_judged_even_when_the_latest_interval_was_calm(
        tmp_path, monkeypatch, deferred):
    """Also where digests are read back at a later step boundary (accelerators)."""
    monkeypatch.setattr(readback, "FORCE_DEFERRED", deferred)
    steps = [0]

    def lookahead_sync(model):
        steps[0] += 1
        if steps[0] % 2 == 0:  # a Lookahead wrapper writes its slow weights back every k=2 steps
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(0.5)

    # the evaluation follows the 4th step, a sync; the interval before it (3 -> 4) was calm
    verdicts = _train_evaluate_train(tmp_path, lambda model, *_: _evaluate(model), after_step=lookahead_sync)
    assert set(verdicts) == {None}


def test_a_best_checkpoint_restored_after_a_worse_evaluation_keeps_the_contract(tmp_path):
    """Newbob-style rollback: the weights kept after one evaluation (a deep copy) are
    loaded back after a later, worse one; they are weights the optimizer left at a step.
    EMA weights copied in at the same place still break it."""
    import copy

    def run(restore_ema: bool) -> list:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        shadow = copy.deepcopy(model)
        with producers.instrument(run_id="r-best", trace_dir=tmp_path / str(restore_ema), quiet=True):
            best = None
            for epoch in range(3):
                model.train()
                for _ in range(3):
                    optimizer.zero_grad()
                    model(torch.randn(8, 4)).pow(2).mean().backward()
                    optimizer.step()
                    with torch.no_grad():
                        for averaged, p in zip(shadow.parameters(), model.parameters()):
                            averaged.lerp_(p, 0.1)
                _evaluate(model)
                if epoch == 0:
                    best = copy.deepcopy(model.state_dict())
                elif restore_ema:
                    model.load_state_dict(shadow.state_dict())
                else:
                    model.load_state_dict(best)  # this epoch was worse: back to the best
        return _verdicts(tmp_path / str(restore_ema))

    assert run(restore_ema=False) == [None] * 3 + [True, None, None, True, None, None]
    assert run(restore_ema=True)[6] is False


def test_weights_an_outer_optimizer_stepped_over_a_copy_are_not_judged(tmp_path):
    """DiLoCo: every few inner steps an outer optimizer over a copy of the weights (no
    model holds it; gradients assigned by hand) steps, its result is copied back into
    the model, and an evaluation follows the sync.  The inner backwards since its
    previous step count as feeding it (``fed``)."""
    outer: list[torch.optim.Optimizer] = []

    def outer_step(model, optimizer, shadow):
        copies = [nn.Parameter(p.detach().clone(), requires_grad=False) for p in shadow]
        outer.append(torch.optim.SGD(copies, lr=0.7, momentum=0.9, nesterov=True))
        for copy, p in zip(copies, model.parameters()):
            copy.grad = copy.data - p.data
        outer[0].step()
        with torch.no_grad():
            for copy, p in zip(copies, model.parameters()):
                p.copy_(copy)
        _evaluate(model)

    assert _train_evaluate_train(tmp_path, outer_step) == [None] * 4 + [None, None, None]
    steps = [event for _, event in trace_events(trace_batches(tmp_path))
             if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == OPTIMIZER_STEP]
    assert [event["fed"] for event in steps] == [True] * 7
