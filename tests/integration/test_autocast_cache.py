"""One long ``torch.autocast`` region around forward, backward and ``optimizer.step()``
trains on the low-precision casts of the weights cached at the region's first forward:
``fresh_autocast_weights`` on ``Optimizer.step`` breaks from the second step inside the
region.  Regions per iteration or per forward, ``cache_enabled=False``, bf16 weights
and loops without autocast keep it or are not judged."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import producers
from invariants.events import OPTIMIZER_STEP
from producers.autocast_cache import autocast_nesting
from tests.support.producer_traces import trace_batches, trace_events

PLAIN_STEPS, AUTOCAST_STEPS = 3, 4


def _bf16(cache_enabled: bool = True):
    return torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=cache_enabled)


def _verdicts(tmp_path) -> list:
    return [((event.get("ctx") or {}).get("contract") or {}).get("fresh_autocast_weights")
            for _, event in trace_events(trace_batches(tmp_path))
            if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == OPTIMIZER_STEP]


def _train(tmp_path, *, layout: str, cache_enabled: bool = True, dtype=torch.float32) -> list:
    """``PLAIN_STEPS`` steps in float32, then ``AUTOCAST_STEPS`` under bf16 autocast laid out
    as ``loop`` (one region around the rest of the loop), ``iteration`` (a region per
    iteration, step included) or ``forward`` (around forward and loss only)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to(dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    def step(forward_context) -> None:
        optimizer.zero_grad()
        with forward_context:
            loss = F.mse_loss(model(torch.randn(16, 8, dtype=dtype)).float(), torch.randn(16, 1))
        loss.backward()
        optimizer.step()

    with producers.instrument(run_id="r-autocast", trace_dir=tmp_path, quiet=True):
        for _ in range(PLAIN_STEPS):
            step(contextlib.nullcontext())
        if layout == "loop":
            with _bf16(cache_enabled):
                for _ in range(AUTOCAST_STEPS):
                    step(contextlib.nullcontext())
        for _ in range(AUTOCAST_STEPS if layout != "loop" else 0):
            if layout == "iteration":
                with _bf16(cache_enabled):
                    step(contextlib.nullcontext())
            else:
                step(_bf16(cache_enabled))
    return _verdicts(tmp_path)


def test_one_autocast_region_around_the_loop_breaks_it_from_its_second_step(tmp_path):
    verdicts = _train(tmp_path, layout="loop")
    assert verdicts == [None] * PLAIN_STEPS + [True] + [False] * (AUTOCAST_STEPS - 1)


@pytest.mark.parametrize("layout", ["iteration", "forward"])
def test_a_region_per_iteration_or_per_forward_keeps_it(tmp_path, layout):
    assert _train(tmp_path, layout=layout) == [None] * PLAIN_STEPS + [True] * AUTOCAST_STEPS


def test_a_region_without_its_cache_or_over_bf16_weights_is_fine(tmp_path):
    assert _train(tmp_path / "uncached", layout="loop", cache_enabled=False) == [None] * (PLAIN_STEPS + AUTOCAST_STEPS)
    assert _train(tmp_path / "bf16", layout="loop", dtype=torch.bfloat16) == [None] * PLAIN_STEPS + [True] * AUTOCAST_STEPS


def test_what_this_relies_on_stale_casts_until_torch_clears_the_cache_at_the_outermost_exit():
    """The premise, on this torch: inside one region a weight updated in place still
    computes with its first cast; ``torch.clear_autocast_cache`` (looked up on ``torch``
    when the outermost region exits) drops it; the nesting read changes nothing."""
    layer = nn.Linear(4, 4, bias=False)
    x = torch.randn(2, 4)
    cleared = []
    original = torch.clear_autocast_cache
    torch.clear_autocast_cache = lambda: (cleared.append(True), original())[1]
    try:
        with _bf16():
            assert autocast_nesting() == 1
            with _bf16():
                assert autocast_nesting() == 2
            assert not cleared and autocast_nesting() == 1
            before = layer(x)
            with torch.no_grad():
                layer.weight.add_(1.0)
            assert torch.equal(layer(x), before)  # the cached cast of the old weight
        assert cleared == [True] and autocast_nesting() == 0
    finally:
        torch.clear_autocast_cache = original
    with _bf16():
        assert not torch.equal(layer(x), before)
