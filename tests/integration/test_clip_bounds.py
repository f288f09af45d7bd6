"""``steps_clipped_grads``: a step right after ``clip_grad_norm_`` applies gradients within
its bound.  A clip handed an iterator the optimizer's constructor already used up clips
nothing (PixArt-alpha PR 160), and the contract breaks at the first step whose gradients
exceed the bound; the tool must not change what the clip does."""

from __future__ import annotations

import torch
from torch import nn

import producers
from invariants.events import OPTIMIZER_STEP
from producers.clip_bounds import _within
from tests.support.producer_traces import trace_batches, trace_events


def _verdicts(tmp_path) -> list:
    return [((event.get("ctx") or {}).get("contract") or {}).get("steps_clipped_grads")
            for _, event in trace_events(trace_batches(tmp_path))
            if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == OPTIMIZER_STEP]


def _train(tmp_path, how: str, scales: list[float]) -> list[float]:
    """One step per scale (the loss is multiplied by it); returns each step's gradient norm."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    params = filter(lambda p: p.requires_grad, model.parameters())
    optimizer = torch.optim.SGD(params, lr=0.01)
    norms = []
    with producers.instrument(run_id="r-clip", trace_dir=tmp_path, quiet=True):
        for scale in scales:
            optimizer.zero_grad()
            (model(torch.ones(8, 4)).mean() * scale).backward()
            if how == "exhausted":
                torch.nn.utils.clip_grad_norm_(params, max_norm=1.0)  # params was used up by SGD
            elif how == "generator":
                torch.nn.utils.clip_grad_norm_((p for p in model.parameters()), max_norm=1.0)
            elif how == "before_backward":
                torch.nn.utils.clip_grad_norm_(list(model.parameters()), max_norm=1.0)
                (model(torch.ones(8, 4)).mean() * scale).backward()
            norms.append(float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])))
            optimizer.step()
    return norms


def test_a_clip_given_a_used_up_iterator_is_reported_where_the_gradients_exceed_its_bound(tmp_path):
    norms = _train(tmp_path, "exhausted", [0.1, 0.1, 0.1, 10.0, 0.1])
    assert norms[3] > 1.0  # the clip clipped nothing, as it does without the tool
    assert _verdicts(tmp_path) == [True, True, True, False, True]


def test_a_clip_given_a_generator_still_clips_and_keeps_the_contract(tmp_path):
    norms = _train(tmp_path, "generator", [0.1, 10.0, 10.0])
    assert max(norms) <= 1.0 + 1e-5
    assert _verdicts(tmp_path) == [True, True, True]


def test_a_clip_before_a_later_backward_is_not_judged(tmp_path):
    _train(tmp_path, "before_backward", [10.0, 10.0])
    assert _verdicts(tmp_path) == [None, None]


def test_steps_without_a_clip_are_not_judged(tmp_path):
    _train(tmp_path, "none", [10.0, 10.0])
    assert _verdicts(tmp_path) == [None, None]



def test_a_clip_of_bf16_gradients_keeps_the_contract_despite_rounding():
    """bf16 gradients scaled by the clip round per element, so the norm can land a little
    above a small bound (the BLOOM-176B reproduction's healthy twin clips to 0.01)."""
    torch.manual_seed(3)
    params = [nn.Parameter(torch.randn(16, dtype=torch.bfloat16)) for _ in range(2)]
    for param in params:
        param.grad = torch.randn(16, dtype=torch.bfloat16)
    torch.nn.utils.clip_grad_norm_(params, max_norm=0.01)
    assert float(torch.nn.utils.get_total_norm([p.grad for p in params])) > 0.01 * 1.001  # rounded above
    assert _within(params, 0.01, 2.0) is True
