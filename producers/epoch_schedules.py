"""Epoch schedules stepped once per batch.

``StepLR`` and ``MultiStepLR`` count in whatever unit ``step()`` is called in, and their
documentation and most recipes count epochs (``step_size=30``, ``milestones=[30, 60]``).
Moved into the batch loop (pytorch#3814, ivadomed#55, SRGAN-PyTorch#1, stgcn#18), the
same numbers count batches: the rate drops by ``gamma`` every few batches and is near
zero within an epoch or two; the loss flattens, nothing errors.  Stepping per batch is
legitimate with periods counted in batches (detection recipes, Lightning's
``interval="step"``), so the call alone is no mistake.  Two things are:

* where the program shows its training epochs (a DataLoader pass begun for training,
  training resumed after an evaluation), a schedule stepped per iteration (its
  optimizer stepped at most once since its previous call) lowers the rate with no
  epoch boundary since its previous drop, or since its first call: it decays faster
  than once an epoch;
* a schedule that was stepped only every few iterations (its optimizer stepped at
  least twice between any two of its calls) is then stepped after a single step with
  no epoch boundary in between: the loop it is stepped in changed from the epoch loop
  to the batch loop (after a boundary, a single step is a short epoch: the tail of a
  run cut at a step budget).

Iterations are counted as steps of the schedule's own optimizer, so a GAN's two
optimizers each step once an iteration and gradient accumulation steps once per
several batches.  Both are the contract ``steps_once_per_epoch``.  Not judged: other
schedule classes, the step a schedule's constructor takes, calls given an explicit
epoch, and schedules a trainer steps per optimizer step by declaration (Lightning's
``interval="step"``, Hugging Face ``Trainer``).
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim.lr_scheduler import MultiStepLR, StepLR

#: how far up the stack a trainer's per-step scheduling loop is looked for
_FRAMES_TO_TRAINER = 12


def lowers_rate(scheduler: StepLR | MultiStepLR) -> bool:
    """Whether this ``step()`` call multiplies the rates by ``gamma``: it reaches a step
    boundary (``StepLR``) or a milestone (``MultiStepLR``)."""
    reached = scheduler.last_epoch + 1
    if scheduler.gamma == 1 or reached <= 0:
        return False
    if isinstance(scheduler, StepLR):
        return reached % scheduler.step_size == 0
    return reached in scheduler.milestones


def stepped_per_step_by_trainer() -> bool:
    """Whether a trainer that declares per-step scheduling makes this call: Lightning's
    ``_update_learning_rates(interval="step")`` or Hugging Face ``Trainer``'s loop.
    Their periods count optimizer steps by contract."""
    frame = sys._getframe(1)
    for _ in range(_FRAMES_TO_TRAINER):
        if frame is None:
            return False
        code = frame.f_code
        if code.co_name == "_update_learning_rates" and frame.f_locals.get("interval") == "step":
            return True
        if code.co_name == "_inner_training_loop" and frame.f_globals.get("__name__", "").startswith("transformers."):
            return True
        frame = frame.f_back
    return False


@dataclass
class _Calls:
    """What one schedule's earlier calls say about the loop it is stepped in."""

    steps: int  # its optimizer's steps at the previous call
    reference_epoch: int  # the epoch at its previous drop, or at its first call
    epoch: int  # the epoch at its previous call
    gaps_wide: bool | None = None  # every gap so far ≥ 2 optimizer steps; None: one call so far


class EpochSchedules:
    """The training epochs the program has shown, its optimizers' steps, and per epoch
    schedule what its calls so far say."""

    def __init__(self) -> None:
        self.epoch = 0  # boundaries seen; 0: the program showed none yet
        self._calls: "weakref.WeakKeyDictionary[Any, _Calls]" = weakref.WeakKeyDictionary()
        self._steps: "weakref.WeakKeyDictionary[torch.optim.Optimizer, int]" = weakref.WeakKeyDictionary()

    def epoch_boundary(self) -> None:
        """A DataLoader pass begun for training, or training resumed after an evaluation."""
        self.epoch += 1

    def optimizer_stepped(self, optimizer: torch.optim.Optimizer) -> None:
        self._steps[optimizer] = self._steps.get(optimizer, 0) + 1

    def steps_once_per_epoch(self, scheduler: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool | None:
        """Judged before a ``step()`` call runs (None: a call this contract does not judge)."""
        if not isinstance(scheduler, (StepLR, MultiStepLR)) or scheduler.last_epoch < 0:
            return None
        if len(args) > 1 or kwargs.get("epoch") is not None:
            return None  # the deprecated form that sets the count directly
        if stepped_per_step_by_trainer():
            return None
        steps = self._steps.get(scheduler.optimizer, 0)
        calls = self._calls.get(scheduler)
        if calls is None:
            self._calls[scheduler] = _Calls(steps, self.epoch, self.epoch)
            return True if self.epoch else None
        gap = steps - calls.steps
        drops = lowers_rate(scheduler)
        # moved from the epoch loop into the batch loop; after an epoch boundary a short
        # gap is a short epoch (the tail of a run cut at a step budget), not a new loop
        kept = not (calls.gaps_wide and gap <= 1 and calls.epoch == self.epoch)
        if drops and gap <= 1 and self.epoch and calls.reference_epoch == self.epoch:
            kept = False  # a second drop, or a first one, within one epoch
        calls.gaps_wide = gap >= 2 if calls.gaps_wide is None else calls.gaps_wide and gap >= 2
        calls.steps = steps
        calls.epoch = self.epoch
        if drops:
            calls.reference_epoch = self.epoch
        if not self.epoch and kept:
            return None  # nothing to judge against but the schedule's own period
        return kept
