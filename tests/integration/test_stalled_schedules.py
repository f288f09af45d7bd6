"""A learning-rate schedule built over an optimizer and never stepped leaves the run at its
initial rate: ``advances_schedule`` breaks at the optimizer's first step of the second
training pass.  Schedules stepped once an epoch or once an iteration, a hand-written
warm-up that moves the rates itself, ``ReduceLROnPlateau``, ``SWALR`` and loops that begin
a DataLoader pass for every batch keep it or are not judged."""

from __future__ import annotations

import lightning.pytorch as lightning
import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.optim.lr_scheduler import ExponentialLR, ReduceLROnPlateau
from torch.optim.swa_utils import SWALR
from torch.utils.data import DataLoader, TensorDataset

import producers
from invariants.events import OPTIMIZER_STEP
from tests.support.producer_traces import trace_batches, trace_events

CONTRACT = "advances_schedule"
BATCHES, EPOCHS = 4, 3


def _verdicts(tmp_path) -> list:
    return [((event.get("ctx") or {}).get("contract") or {}).get(CONTRACT, "absent")
            for _, event in trace_events(trace_batches(tmp_path))
            if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == OPTIMIZER_STEP]


def _train(tmp_path, *, schedule: str) -> None:
    """``schedule``: ``forgotten`` (built, never stepped), stepped per ``epoch`` or per
    ``iteration``, a hand ``warmup`` that sets the rate itself, ``plateau`` or ``swa``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(BATCHES * 4, 4), torch.randn(BATCHES * 4, 1)), batch_size=4)
    with producers.instrument(run_id="r-schedule", trace_dir=tmp_path, quiet=True):
        if schedule == "plateau":
            scheduler = ReduceLROnPlateau(optimizer)
        elif schedule == "swa":
            scheduler = SWALR(optimizer, swa_lr=0.05)
        else:
            scheduler = ExponentialLR(optimizer, gamma=0.5)
        for epoch in range(EPOCHS):
            for index, (x, y) in enumerate(loader):
                if schedule == "warmup":
                    for group in optimizer.param_groups:
                        group["lr"] = 0.1 * min(1.0, (epoch * BATCHES + index + 1) / 6)
                optimizer.zero_grad()
                F.mse_loss(model(x), y).backward()
                optimizer.step()
                if schedule == "iteration":
                    scheduler.step()
            if schedule == "epoch":
                scheduler.step()


def test_a_schedule_never_stepped_breaks_it_at_each_later_pass_start(tmp_path):
    _train(tmp_path, schedule="forgotten")
    verdicts = _verdicts(tmp_path)
    assert verdicts == [None] * BATCHES + [False] + [None] * (BATCHES - 1) + [False] + [None] * (BATCHES - 1)


@pytest.mark.parametrize("schedule", ["epoch", "iteration", "warmup"])
def test_schedules_stepped_or_rates_moved_by_hand_keep_it(tmp_path, schedule):
    _train(tmp_path, schedule=schedule)
    verdicts = _verdicts(tmp_path)
    assert verdicts.count(True) == EPOCHS - 1
    assert False not in verdicts


@pytest.mark.parametrize("schedule", ["plateau", "swa"])
def test_schedules_with_a_cadence_of_their_own_are_not_judged(tmp_path, schedule):
    _train(tmp_path, schedule=schedule)
    assert set(_verdicts(tmp_path)) == {None}


def test_a_fresh_pass_for_every_batch_is_not_judged(tmp_path):
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=4, shuffle=True)
    with producers.instrument(run_id="r-schedule", trace_dir=tmp_path, quiet=True):
        scheduler = ExponentialLR(optimizer, gamma=0.5)
        for _ in range(6):
            x, y = next(iter(loader))
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()
    assert scheduler.last_epoch == 0
    assert set(_verdicts(tmp_path)) == {None}


def test_a_schedule_built_after_a_pass_began_waits_for_a_whole_pass(tmp_path):
    """Built during the first pass, it is not judged at the second pass's start (it never
    had a whole pass to be stepped in), and breaks at the third's."""
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4)
    schedules = []
    with producers.instrument(run_id="r-schedule", trace_dir=tmp_path, quiet=True):
        for epoch in range(EPOCHS):
            for index, (x, y) in enumerate(loader):
                if epoch == 0 and index == 1:
                    schedules.append(ExponentialLR(optimizer, gamma=0.5))
                optimizer.zero_grad()
                F.mse_loss(model(x), y).backward()
                optimizer.step()
    verdicts = _verdicts(tmp_path)
    assert verdicts[BATCHES] is None and verdicts[2 * BATCHES] is False


class _Regressor(lightning.LightningModule):
    """A Lightning module whose ``configure_optimizers`` returns an epoch schedule; with
    ``manual`` it optimises by hand, and ``steps_schedule`` says whether it steps it."""

    def __init__(self, manual: bool, steps_schedule: bool, frequency: int = 1) -> None:
        super().__init__()
        self.automatic_optimization = not manual
        self.steps_schedule = steps_schedule
        self.frequency = frequency
        self.body = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.body(x), y)
        if self.automatic_optimization:
            return loss
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return loss

    def on_train_epoch_end(self):
        if not self.automatic_optimization and self.steps_schedule:
            self.lr_schedulers().step()

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        schedule = {"scheduler": ExponentialLR(optimizer, gamma=0.5), "interval": "epoch",
                    "frequency": self.frequency}
        return {"optimizer": optimizer, "lr_scheduler": schedule}


def _fit(tmp_path, module: lightning.LightningModule) -> list:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4 * BATCHES, 4), torch.randn(4 * BATCHES, 1))
    with producers.instrument(run_id="r-lightning-schedule", trace_dir=tmp_path, quiet=True):
        trainer = lightning.Trainer(max_epochs=EPOCHS, logger=False, enable_checkpointing=False,
                                    enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                                    devices=1)
        trainer.fit(module, DataLoader(data, batch_size=4))
    return _verdicts(tmp_path)


def test_lightning_manual_optimisation_that_never_steps_its_schedule_breaks_it(tmp_path):
    verdicts = _fit(tmp_path, _Regressor(manual=True, steps_schedule=False))
    assert verdicts.count(False) == EPOCHS - 1


def test_lightning_manual_optimisation_that_steps_its_schedule_keeps_it(tmp_path):
    verdicts = _fit(tmp_path, _Regressor(manual=True, steps_schedule=True))
    assert verdicts.count(True) == EPOCHS - 1 and False not in verdicts


def test_a_schedule_lightning_steps_every_few_epochs_is_not_judged(tmp_path):
    verdicts = _fit(tmp_path, _Regressor(manual=False, steps_schedule=False, frequency=EPOCHS))
    assert set(verdicts) == {None}
