"""An epoch's trailing micro-batches whose gradients are neither stepped nor cleared leak
into the next epoch's first step: ``carries_no_epoch_tail`` breaks there, because that
step applies more backwards than any step within one epoch.  Stepping on the tail,
clearing at the start of each epoch, counting micro-batches over the whole run (a cycle
that crosses the boundary still holds k), and a fresh DataLoader pass per batch keep it
or are not judged.  Counting over the whole run *and* clearing at each epoch's start
cuts the cycle that crosses the boundary: ``keeps_cycle_across_epoch`` breaks at its
step."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import producers
from invariants.events import OPTIMIZER_STEP
from tests.support.producer_traces import trace_batches, trace_events

CONTRACT = "carries_no_epoch_tail"
CUT_CONTRACT = "keeps_cycle_across_epoch"
ACCUMULATION, BATCHES, EPOCHS = 3, 7, 3  # 7 batches an epoch: two full cycles and one leftover


def _verdicts(tmp_path, contract: str = CONTRACT) -> list:
    return [((event.get("ctx") or {}).get("contract") or {}).get(contract, "absent")
            for _, event in trace_events(trace_batches(tmp_path))
            if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == OPTIMIZER_STEP]


def _train(tmp_path, *, tail: str) -> None:
    """``tail``: what the loop does with an epoch's leftover micro-batch: ``leak``,
    ``step`` it, ``clear`` at each epoch's start, count micro-batches ``globally``, or
    both (``globally_cleared``: ultralytics PR 11217)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(BATCHES * 4, 4), torch.randn(BATCHES * 4, 1)), batch_size=4)
    micro_batches = 0
    with producers.instrument(run_id="r-tail", trace_dir=tmp_path, quiet=True):
        for _ in range(EPOCHS):
            if tail in ("clear", "globally_cleared"):
                optimizer.zero_grad()
            for index, (x, y) in enumerate(loader):
                (F.mse_loss(model(x), y) / ACCUMULATION).backward()
                micro_batches += 1
                counted = micro_batches if tail.startswith("globally") else index + 1
                if counted % ACCUMULATION == 0 or (tail == "step" and index == BATCHES - 1):
                    optimizer.step()
                    optimizer.zero_grad()


def test_a_leftover_micro_batch_breaks_the_contract_at_the_next_epochs_first_step(tmp_path):
    _train(tmp_path, tail="leak")
    assert _verdicts(tmp_path) == [True, True, False, True, False, True]


@pytest.mark.parametrize("tail", ["step", "clear", "globally"])
def test_tails_stepped_cleared_or_counted_over_the_run_keep_it(tmp_path, tail):
    _train(tmp_path, tail=tail)
    verdicts = _verdicts(tmp_path)
    assert verdicts and set(verdicts) == {True}


def test_a_fresh_pass_for_every_batch_is_not_judged(tmp_path):
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=4, shuffle=True)
    with producers.instrument(run_id="r-tail", trace_dir=tmp_path, quiet=True):
        for _ in range(4):
            for _ in range(2):
                x, y = next(iter(loader))
                (F.mse_loss(model(x), y) / 2).backward()
            optimizer.step()
            optimizer.zero_grad()
    assert _verdicts(tmp_path) == [None] * 4


def test_a_clear_at_each_epochs_start_cuts_a_cycle_counted_over_the_run(tmp_path):
    _train(tmp_path, tail="globally_cleared")  # 7 a pass, k = 3: the first cycle of epochs 1 and 2 holds 2, 1
    assert _verdicts(tmp_path, CUT_CONTRACT) == [True, True, False, True, False, True, True]


@pytest.mark.parametrize("tail", ["clear", "globally", "step"])
def test_a_clear_that_drops_a_tail_never_stepped_or_no_clear_keeps_whole_cycles(tmp_path, tail):
    _train(tmp_path, tail=tail)
    assert set(_verdicts(tmp_path, CUT_CONTRACT)) == {True}
