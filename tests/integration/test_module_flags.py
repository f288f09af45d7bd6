"""``module.requires_grad = False`` only sets an attribute on an ``nn.Module``: its
parameters keep training.  ``freezes_through_parameters`` breaks at the first step that
updates them (ProtoContra-SFDA#18); ``requires_grad_(False)``, or the attribute set
together with the real freeze, keeps it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import producers
from invariants.events import OPTIMIZER_STEP
from tests.support.producer_traces import trace_batches, trace_events


def _verdicts(tmp_path) -> list:
    return [((event.get("ctx") or {}).get("contract") or {}).get("freezes_through_parameters", "absent")
            for _, event in trace_events(trace_batches(tmp_path))
            if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == OPTIMIZER_STEP]


def _adapt(tmp_path, freeze: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    with producers.instrument(run_id="r-flag", trace_dir=tmp_path, quiet=True):
        for step in range(5):
            if step == 2:  # adaptation starts: the head is meant to stay fixed
                if freeze in ("method", "both"):
                    model[2].requires_grad_(False)
                if freeze in ("attribute", "both"):
                    model[2].requires_grad = False
            optimizer.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            optimizer.step()


def test_an_attribute_freeze_breaks_the_contract_from_the_step_it_should_have_frozen(tmp_path):
    _adapt(tmp_path, "attribute")
    assert _verdicts(tmp_path) == [True, True, False, False, False]


@pytest.mark.parametrize("freeze", ["method", "both"])
def test_a_real_freeze_keeps_it(tmp_path, freeze):
    _adapt(tmp_path, freeze)
    assert _verdicts(tmp_path) == [True] * 5
