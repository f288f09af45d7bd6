"""An epoch schedule (``StepLR``/``MultiStepLR``) moved into the batch loop decays every few
batches: ``steps_once_per_epoch`` breaks at a drop with no epoch boundary since the
previous drop or the schedule's first call, when it is stepped per iteration, and at
the first per-iteration call of a schedule that was stepped every few iterations.
Per-epoch stepping, per-iteration schedules whose period is longer than an epoch, loops
whose epochs are invisible, other schedule classes and Lightning's ``interval="step"``
keep it or are not judged."""

from __future__ import annotations

import lightning.pytorch as lightning
import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.optim import lr_scheduler
from torch.utils.data import DataLoader, TensorDataset

import producers
from invariants.events import SCHEDULER_STEP
from tests.support.producer_traces import trace_batches, trace_events

BATCHES_PER_EPOCH = 6


def _verdicts(tmp_path) -> list:
    contracts = [(event.get("ctx") or {}).get("contract") or {} for _, event in trace_events(trace_batches(tmp_path))
                 if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == SCHEDULER_STEP]
    return [contract.get("steps_once_per_epoch", "absent") for contract in contracts]


def _loader() -> DataLoader:
    data = TensorDataset(torch.randn(8 * BATCHES_PER_EPOCH, 4), torch.randn(8 * BATCHES_PER_EPOCH, 1))
    return DataLoader(data, batch_size=8, shuffle=True)


def _train(tmp_path, make_scheduler, *, per_batch: bool, epochs: int = 3, evaluate: bool = False) -> list:
    """``epochs`` passes over a DataLoader (or, with ``evaluate``, synthetic batches and an
    evaluation after each epoch), the schedule stepped per batch or per epoch."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with producers.instrument(run_id="r-epochs", trace_dir=tmp_path, quiet=True):
        scheduler = make_scheduler(optimizer)
        loader = _loader()
        for _ in range(epochs):
            model.train()
            batches = ((torch.randn(8, 4), torch.randn(8, 1)) for _ in range(BATCHES_PER_EPOCH)) if evaluate else loader
            for x, y in batches:
                optimizer.zero_grad()
                F.mse_loss(model(x), y).backward()
                optimizer.step()
                if per_batch:
                    scheduler.step()
            if evaluate:
                model.eval()
                with torch.no_grad():
                    model(torch.randn(8, 4))
            if not per_batch:
                scheduler.step()
    return _verdicts(tmp_path)


def _step_lr(step_size: int):
    return lambda optimizer: lr_scheduler.StepLR(optimizer, step_size=step_size, gamma=0.1)


def test_an_epoch_schedule_stepped_per_batch_breaks_the_contract_at_its_first_drop(tmp_path):
    verdicts = _train(tmp_path, _step_lr(2), per_batch=True)
    # the constructor's step is not judged; the second call reaches step_size in the first epoch
    assert verdicts[:3] == ["absent", True, False]
    # later epochs: their first drop follows an epoch boundary, the other two do not
    assert verdicts.count(False) == 3 + 2 + 2


def test_multistep_milestones_in_epochs_break_it_at_the_first_milestone(tmp_path):
    verdicts = _train(tmp_path, lambda opt: lr_scheduler.MultiStepLR(opt, milestones=[4, 30]), per_batch=True)
    assert verdicts.index(False) == 4 and verdicts.count(False) == 1


def test_evaluations_between_epochs_show_the_epochs_too(tmp_path):
    verdicts = _train(tmp_path, _step_lr(2), per_batch=True, evaluate=True)
    # the first epoch precedes any evaluation: nothing to judge against yet
    assert set(verdicts[:BATCHES_PER_EPOCH + 1]) == {"absent"}
    assert False in verdicts[BATCHES_PER_EPOCH + 1:BATCHES_PER_EPOCH * 2 + 1]


@pytest.mark.parametrize("step_size", [1, 2])
def test_an_epoch_schedule_stepped_per_epoch_keeps_it(tmp_path, step_size):
    assert _train(tmp_path, _step_lr(step_size), per_batch=False) == ["absent", True, True, True]


@pytest.mark.parametrize("step_size", [1, 2])
def test_a_run_cut_at_a_step_budget_keeps_it_in_its_one_step_last_epoch(tmp_path, step_size):
    """Stepped per epoch, the last epoch one batch long (the budget's remainder, as the
    MNIST example's ``--dry-run``-style budgets do): a short epoch, not a new loop."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with producers.instrument(run_id="r-budget", trace_dir=tmp_path, quiet=True):
        scheduler = _step_lr(step_size)(optimizer)
        budget = 2 * BATCHES_PER_EPOCH + 1
        for _ in range(3):
            for x, y in _loader():
                if budget == 0:
                    break
                optimizer.zero_grad()
                F.mse_loss(model(x), y).backward()
                optimizer.step()
                budget -= 1
            scheduler.step()
    assert _verdicts(tmp_path) == ["absent", True, True, True]


def test_a_per_iteration_schedule_with_a_period_longer_than_an_epoch_keeps_it(tmp_path):
    verdicts = _train(tmp_path, _step_lr(BATCHES_PER_EPOCH + 2), per_batch=True, epochs=4)
    assert verdicts[0] == "absent" and set(verdicts[1:]) == {True}


@pytest.mark.parametrize("make", [lambda opt: lr_scheduler.ExponentialLR(opt, gamma=0.5),
                                  lambda opt: lr_scheduler.LambdaLR(opt, lambda step: 0.5 ** step)],
                         ids=["exponential", "lambda"])
def test_other_schedule_classes_are_not_judged(tmp_path, make):
    assert set(_train(tmp_path, make, per_batch=True)) == {"absent"}


def test_a_schedule_moved_from_the_epoch_loop_into_the_batch_loop_breaks_it_at_once(tmp_path):
    """No DataLoader and no evaluation: the epochs are invisible, but the cadence changed."""
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with producers.instrument(run_id="r-cadence", trace_dir=tmp_path, quiet=True):
        scheduler = lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.5)
        for iteration in range(10):
            optimizer.zero_grad()
            F.mse_loss(model(torch.randn(8, 4)), torch.randn(8, 1)).backward()
            optimizer.step()
            if iteration >= 6 or iteration % 2 == 1:
                scheduler.step()
    # calls after iterations 1, 3, 5 (every other one), then 6, 7, 8, 9: only the change is judged
    assert _verdicts(tmp_path) == ["absent"] * 4 + [False] + ["absent"] * 3


def test_a_per_step_interval_declared_to_lightning_is_not_judged(tmp_path):
    class Regressor(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            return {"optimizer": optimizer,
                    "lr_scheduler": {"scheduler": lr_scheduler.StepLR(optimizer, step_size=2), "interval": "step"}}

    with producers.instrument(run_id="r-lightning", trace_dir=tmp_path, quiet=True):
        trainer = lightning.Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                    enable_model_summary=False, accelerator="cpu", devices=1)
        trainer.fit(Regressor(), _loader())
    verdicts = _verdicts(tmp_path)
    assert len(verdicts) == 1 + 2 * BATCHES_PER_EPOCH and set(verdicts) == {"absent"}
