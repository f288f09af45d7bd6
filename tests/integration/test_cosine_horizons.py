"""A ``CosineAnnealingLR`` stepped past its ``T_max`` climbs back to the base rate: a
horizon counted in epochs for a schedule stepped per batch (ScrollPrize/villa PR 1495)
breaks ``anneals_within_horizon`` once it runs a tenth of its horizon (at least one
step) past it.  A horizon counted in scheduler steps keeps it, also after a warm-up in
a ``SequentialLR`` and when epoch tails the horizon's floor division left out run it a
step or two over, and a last schedule step after the final optimizer step is never
judged."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR

import producers
from invariants.events import OPTIMIZER_STEP
from tests.support.producer_traces import trace_batches, trace_events

CONTRACT = "anneals_within_horizon"
EPOCHS, BATCHES = 3, 4


def _verdicts(tmp_path) -> list:
    return [((event.get("ctx") or {}).get("contract") or {}).get(CONTRACT)
            for _, event in trace_events(trace_batches(tmp_path))
            if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == OPTIMIZER_STEP]


def _train(tmp_path, horizon: int, nested: bool = False) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with producers.instrument(run_id="r-cosine", trace_dir=tmp_path, quiet=True):
        cosine = CosineAnnealingLR(optimizer, T_max=horizon)
        scheduler = (SequentialLR(optimizer, [LinearLR(optimizer, 0.5, total_iters=1), cosine], milestones=[1])
                     if nested else cosine)
        for _ in range(EPOCHS):
            for _ in range(BATCHES):
                optimizer.zero_grad()
                F.mse_loss(model(torch.randn(8, 4)), torch.randn(8, 1)).backward()
                optimizer.step()
                scheduler.step()


def test_a_horizon_in_epochs_stepped_per_batch_breaks_it_past_the_horizon(tmp_path):
    _train(tmp_path, horizon=EPOCHS)
    # T_max = 3, one step of slack: the 5th schedule step, before the 6th optimizer step, is past it
    assert _verdicts(tmp_path) == [True] * 5 + [False] * (EPOCHS * BATCHES - 5)


def test_a_horizon_in_scheduler_steps_keeps_it_to_the_last_step(tmp_path):
    # sized with floor division, one step short of the run: the last update runs a step over
    _train(tmp_path, horizon=EPOCHS * BATCHES - 2)
    assert _verdicts(tmp_path) == [True] * (EPOCHS * BATCHES)


def test_a_cosine_after_a_warm_up_counts_its_horizon_from_the_hand_over(tmp_path):
    """``SequentialLR`` restarts the cosine at epoch 0 at its milestone."""
    _train(tmp_path, horizon=EPOCHS * BATCHES - 2, nested=True)
    assert _verdicts(tmp_path) == [True] * (EPOCHS * BATCHES)


def test_a_transformers_schedule_stepped_past_its_training_steps_breaks_it(tmp_path):
    """``get_cosine_schedule_with_warmup(num_training_steps=epochs)`` stepped per batch
    climbs back after its horizon, as ScrollPrize/villa PR 1495 found."""
    from transformers import get_cosine_schedule_with_warmup

    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    with producers.instrument(run_id="r-hf-cosine", trace_dir=tmp_path, quiet=True):
        scheduler = get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=1, num_training_steps=EPOCHS)
        for _ in range(EPOCHS * BATCHES):
            optimizer.zero_grad()
            F.mse_loss(model(torch.randn(8, 4)), torch.randn(8, 1)).backward()
            optimizer.step()
            scheduler.step()
    assert _verdicts(tmp_path) == [True] * 5 + [False] * (EPOCHS * BATCHES - 5)
