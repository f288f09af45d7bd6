"""Learning-rate schedules that are built over an optimizer and never stepped.

A schedule does nothing until its ``step()`` is called: a loop that builds one and
forgets the call, or calls it on a path that never runs, trains at the initial rate for
the whole run (a warm-up's first factor, or the peak rate a decay was meant to leave).
Lightning steps the schedules ``configure_optimizers`` returns only under automatic
optimisation; after a port to manual optimisation nothing steps them (so-vits-svc-fork
PR 291).  Nothing fails and the loss still falls, only more slowly or noisily.

A schedule stepped once an epoch has been stepped by the time its optimizer starts the
next training pass, and one stepped per iteration long before.  So the first step an
optimizer takes in a new training DataLoader pass carries the contract
``advances_schedule``: if a schedule was built over it before its first step of the
previous pass, and that pass held at least two of its steps, some schedule over the
optimizer has been stepped since it was built, or its rates have moved (a hand-written
warm-up or decay that left the schedule object unused).  Not judged: ``ReduceLROnPlateau``
(stepped on a validation metric, perhaps every few epochs), ``SWALR`` (built up front for a
later averaging phase), schedules a Lightning module returns under automatic optimisation
(the trainer steps them on its own cadence, every few epochs if so configured), optimizers
with rates that are not plain numbers, and loops that begin a DataLoader pass for every
batch.
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim.lr_scheduler import ReduceLROnPlateau
from torch.optim.swa_utils import SWALR

from .learning_rates import plain_rates

#: how far up the stack a schedule's constructor looks for a ``configure_optimizers``
_FRAMES_TO_CONFIGURE = 12
#: schedules stepped on another cadence than training passes by design
_OWN_CADENCE = (ReduceLROnPlateau, SWALR)
#: steps a pass must hold before a schedule that was not stepped over it counts as stalled
MIN_STEPS_IN_PASS = 2


def _lightning_module_building(frame: Any) -> Any:
    """The module whose ``configure_optimizers`` is building this schedule, if any."""
    for _ in range(_FRAMES_TO_CONFIGURE):
        if frame is None:
            return None
        if frame.f_code.co_name == "configure_optimizers":
            owner = frame.f_locals.get("self")
            return owner if hasattr(owner, "automatic_optimization") else None
        frame = frame.f_back
    return None


@dataclass
class _Schedule:
    scheduler: "weakref.ref[Any]"
    built_at: int  # its optimizer's steps when it was built
    lightning_module: "weakref.ref[Any] | None"

    def stepped_by_trainer(self) -> bool:
        module = self.lightning_module() if self.lightning_module is not None else None
        return bool(getattr(module, "automatic_optimization", False))


@dataclass
class _Pass:
    number: int  # training passes begun before it
    first_step: int  # the optimizer's steps before its first one in this pass
    steps: int


class StalledSchedules:
    """Per optimizer: the schedules built over it, whether one advanced, its steps and passes."""

    def __init__(self) -> None:
        self._schedules: "weakref.WeakKeyDictionary[torch.optim.Optimizer, list[_Schedule]]" = weakref.WeakKeyDictionary()
        self._advanced: "weakref.WeakSet[torch.optim.Optimizer]" = weakref.WeakSet()
        self._unread: "weakref.WeakSet[torch.optim.Optimizer]" = weakref.WeakSet()
        self._first_rates: "weakref.WeakKeyDictionary[torch.optim.Optimizer, list[float]]" = weakref.WeakKeyDictionary()
        self._steps: "weakref.WeakKeyDictionary[torch.optim.Optimizer, int]" = weakref.WeakKeyDictionary()
        self._passes: "weakref.WeakKeyDictionary[torch.optim.Optimizer, _Pass]" = weakref.WeakKeyDictionary()

    def scheduler_step(self, scheduler: Any) -> None:
        """Before any ``LRScheduler.step``: the constructor's own step (``last_epoch``
        still below 0) registers the schedule; any later one advances its optimizer's."""
        optimizer = getattr(scheduler, "optimizer", None)
        epoch = getattr(scheduler, "last_epoch", None)
        if not isinstance(optimizer, torch.optim.Optimizer) or not isinstance(epoch, int):
            return
        if epoch >= 0:
            self._advanced.add(optimizer)
            return
        if isinstance(scheduler, _OWN_CADENCE):
            return
        module = _lightning_module_building(sys._getframe(1))
        schedule = _Schedule(weakref.ref(scheduler), self._steps.get(optimizer, 0),
                             None if module is None else weakref.ref(module))
        self._schedules.setdefault(optimizer, []).append(schedule)

    def advances_schedule(self, optimizer: torch.optim.Optimizer, training_pass: int) -> bool | None:
        """Judged before each step of ``optimizer``, ``training_pass`` being the training
        DataLoader passes begun so far (None: not judged at this step)."""
        steps = self._steps.get(optimizer, 0)
        self._steps[optimizer] = steps + 1
        schedules = self._schedules.get(optimizer)
        if schedules and optimizer not in self._advanced:
            self._note_rates(optimizer)
        previous = self._passes.get(optimizer)
        if previous is not None and previous.number == training_pass:
            previous.steps += 1
            return None
        self._passes[optimizer] = _Pass(training_pass, steps, 1)
        if previous is None or not schedules or optimizer in self._unread:
            return None
        if optimizer in self._advanced:
            return True
        waiting = [schedule for schedule in schedules
                   if schedule.scheduler() is not None and schedule.built_at <= previous.first_step
                   and not schedule.stepped_by_trainer()]
        if not waiting or previous.steps < MIN_STEPS_IN_PASS:
            return None
        return False

    def _note_rates(self, optimizer: torch.optim.Optimizer) -> None:
        """Rates that moved since the first step after a schedule was built mean that
        something schedules the optimizer (a hand-written warm-up or decay): the
        contract then holds for good.  Rates that are not plain numbers (a tensor that may
        live on an accelerator) are not read, and the optimizer is not judged."""
        rates = plain_rates(optimizer)
        if rates is None:
            self._unread.add(optimizer)
            return
        first = self._first_rates.setdefault(optimizer, rates)
        if rates != first:
            self._advanced.add(optimizer)
