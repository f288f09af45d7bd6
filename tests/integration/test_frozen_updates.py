"""A layer frozen partway with ``requires_grad = False`` keeps moving when it keeps a
gradient: ``keeps_frozen_weights`` on ``Optimizer.step`` breaks from the first step after
the freeze where weight decay, the momentum left from training or the gradient itself
would move it.  Clearing to None, a new optimizer over the trainable part, parts frozen
from the start and a plain SGD step over zero gradients keep it."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

import producers
from invariants.events import OPTIMIZER_STEP
from tests.support.producer_traces import trace_batches, trace_events

WARM, FROZEN = 3, 3


def _verdicts(tmp_path) -> list:
    return [((event.get("ctx") or {}).get("contract") or {}).get("keeps_frozen_weights")
            for _, event in trace_events(trace_batches(tmp_path))
            if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == OPTIMIZER_STEP]


def _train(tmp_path, make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer], *,
           set_to_none: bool = False, frozen_from_start: bool = False, rebuild: bool = False,
           freeze_after_backward: bool = False) -> tuple[list, bool]:
    """``WARM`` steps with the whole model trainable, then ``FROZEN`` with its first layer
    frozen; returns the verdicts and whether the frozen layer moved."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 2))
    backbone = model[0]
    if frozen_from_start:
        backbone.requires_grad_(False)
    optimizer = make_optimizer(list(model.parameters()))
    frozen_weight = None
    with producers.instrument(run_id="r-frozen", trace_dir=tmp_path, quiet=True):
        for step in range(WARM + FROZEN):
            freezing = step == WARM
            if freezing and not freeze_after_backward:
                backbone.requires_grad_(False)
                if rebuild:
                    optimizer = make_optimizer([p for p in model.parameters() if p.requires_grad])
            if freezing:
                frozen_weight = backbone.weight.detach().clone()
            optimizer.zero_grad(set_to_none=set_to_none)
            F.mse_loss(model(torch.randn(8, 6)), torch.randn(8, 2)).backward()
            if freezing and freeze_after_backward:
                backbone.requires_grad_(False)
            optimizer.step()
    return _verdicts(tmp_path), not torch.equal(frozen_weight, backbone.weight)


def test_zero_gradients_kept_under_weight_decay_move_the_frozen_layer(tmp_path):
    verdicts, moved = _train(tmp_path, lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1))
    assert moved
    assert verdicts == [None] + [True] * (WARM - 1) + [False] * FROZEN


def test_momentum_left_from_training_moves_the_frozen_layer_without_decay(tmp_path):
    verdicts, moved = _train(tmp_path, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    assert moved
    assert verdicts == [None] + [True] * (WARM - 1) + [False] * FROZEN


def test_a_freeze_between_backward_and_step_moves_it_through_the_gradient(tmp_path):
    verdicts, moved = _train(tmp_path, lambda ps: torch.optim.SGD(ps, lr=0.1), freeze_after_backward=True)
    assert moved
    assert verdicts[WARM] is False


def test_clearing_to_none_or_rebuilding_the_optimizer_keeps_it(tmp_path):
    adamw = lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1)  # noqa: E731
    verdicts, moved = _train(tmp_path / "none", adamw, set_to_none=True)
    assert not moved and verdicts == [None] + [True] * (WARM + FROZEN - 1)
    verdicts, moved = _train(tmp_path / "rebuilt", adamw, rebuild=True)
    assert not moved and verdicts == [None] + [True] * (WARM - 1) + [None] + [True] * (FROZEN - 1)


def test_parts_frozen_from_the_start_and_zero_gradients_under_plain_sgd_are_fine(tmp_path):
    adamw = lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1)  # noqa: E731
    verdicts, _ = _train(tmp_path / "start", adamw, frozen_from_start=True)
    assert verdicts == [None] + [True] * (WARM + FROZEN - 1)
    verdicts, moved = _train(tmp_path / "sgd", lambda ps: torch.optim.SGD(ps, lr=0.1))
    assert not moved and verdicts == [None] + [True] * (WARM + FROZEN - 1)


def test_momentum_on_an_accelerator_is_reported_as_not_judged():
    from producers.frozen_updates import FrozenUpdates

    param = nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([param], lr=0.1, momentum=0.9)
    updates = FrozenUpdates()
    assert updates.keeps_frozen_weights(optimizer) is None
    param.requires_grad_(False)
    param.grad = torch.zeros(3)
    optimizer.state[param]["momentum_buffer"] = torch.ones(3, device="meta")
    assert updates.keeps_frozen_weights(optimizer) is None
    optimizer.state[param]["momentum_buffer"] = torch.ones(3)
    assert updates.keeps_frozen_weights(optimizer) is False


def _train_with_hook(tmp_path, make_optimizer, mask_rows: bool) -> list:
    """``WARM`` steps, then a gradient hook on the first layer's weight that zeroes all of
    it (a freeze, pytorch#38581) or only its first rows (new rows keep training)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 2))
    optimizer = make_optimizer(list(model.parameters()))
    with producers.instrument(run_id="r-hook", trace_dir=tmp_path, quiet=True):
        for step in range(WARM + FROZEN):
            if step == WARM:
                mask = torch.zeros(12, 1)
                if mask_rows:
                    mask[:4] = 1
                model[0].weight.register_hook(lambda grad: grad * mask)
            optimizer.zero_grad()
            F.mse_loss(model(torch.randn(8, 6)), torch.randn(8, 2)).backward()
            optimizer.step()
    return _verdicts(tmp_path)


def test_a_hook_that_zeroes_the_gradient_freezes_nothing_under_weight_decay(tmp_path):
    verdicts = _train_with_hook(tmp_path, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-3),
                                mask_rows=False)
    assert verdicts == [None] + [True] * (WARM - 1) + [False] * FROZEN


def test_a_hook_that_masks_rows_or_zeroes_without_decay_keeps_it(tmp_path):
    decayed = lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1)  # noqa: E731
    assert set(_train_with_hook(tmp_path / "rows", decayed, mask_rows=True)) == {None, True}
    momentum_only = lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)  # noqa: E731
    assert set(_train_with_hook(tmp_path / "plain", momentum_only, mask_rows=False)) == {None, True}
