"""A loop that accumulates k micro-batches per step but steps on every micro-batch of the
loader's last batch (accelerate syncing with the dataloader, accelerate#1847) breaks
``steps_whole_cycles`` at the second short cycle of the epoch.  One short tail per
epoch, accumulation to a varying budget, and steps without accumulation keep it or are
not judged."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import producers
from invariants.events import OPTIMIZER_STEP
from tests.support.producer_traces import trace_batches, trace_events

CONTRACT = "steps_whole_cycles"
BATCHES, SPLIT = 6, 4  # each loaded batch is split into SPLIT micro-batches


def _verdicts(tmp_path) -> list:
    return [((event.get("ctx") or {}).get("contract") or {}).get(CONTRACT, "absent")
            for _, event in trace_events(trace_batches(tmp_path))
            if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == OPTIMIZER_STEP]


def _train(tmp_path, *, last_batch: str, epochs: int = 2) -> None:
    """``last_batch``: how the loader's last batch steps: ``each`` micro-batch alone (the
    bug), ``once`` after all of them, or ``tail`` (a last batch half as large: one short
    cycle); ``budget`` accumulates to a budget that varies from cycle to cycle."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    rows = BATCHES * 8 - (4 if last_batch == "tail" else 0)
    loader = DataLoader(TensorDataset(torch.randn(rows, 4), torch.randn(rows, 1)), batch_size=8)
    budgets = iter([3, 5, 2, 4, 1, 6, 3, 2, 5, 4, 1, 3] * 4)
    with producers.instrument(run_id="r-cycles", trace_dir=tmp_path, quiet=True):
        for _ in range(epochs):
            for index, (x, y) in enumerate(loader):
                last = index == BATCHES - 1
                micro = list(zip(x.split(2), y.split(2)))
                budget = next(budgets)
                for position, (xs, ys) in enumerate(micro):
                    (F.mse_loss(model(xs), ys) / len(micro)).backward()
                    end = position == len(micro) - 1
                    if end or (last and last_batch == "each") or (last_batch == "budget" and position + 1 == budget):
                        optimizer.step()
                        optimizer.zero_grad()


def test_stepping_each_micro_batch_of_the_last_batch_breaks_the_contract_from_the_second(tmp_path):
    _train(tmp_path, last_batch="each")
    per_epoch = [None, None, True, True, True, True, False, False, False]
    assert _verdicts(tmp_path) == per_epoch * 2


def test_one_step_per_loaded_batch_and_a_short_tail_keep_the_contract(tmp_path):
    _train(tmp_path / "once", last_batch="once")
    assert _verdicts(tmp_path / "once") == [None, None, True, True, True, True] * 2
    _train(tmp_path / "tail", last_batch="tail")
    assert _verdicts(tmp_path / "tail") == [None, None, True, True, True, True] * 2


def test_cycles_of_varying_length_are_not_judged(tmp_path):
    _train(tmp_path, last_batch="budget")
    assert set(_verdicts(tmp_path)) == {None}
