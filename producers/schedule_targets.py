"""Learning-rate schedules that write their rates into an optimizer nobody steps.

A schedule holds the optimizer it was built over.  When training goes on with another
one, the schedule keeps "working" — ``get_last_lr()`` decays as planned — while the rates
the steps use stay where they were: a warm-up scheduler whose nested ``after_scheduler``
was pickled with a copy of the optimizer and restored from a checkpoint
(ildoonet/pytorch-gradual-warmup-lr issue 27), a schedule built before the optimizer was
rebuilt (after an unfreeze, a resize, a resume) and never rebuilt with it.

So each optimizer step carries ``schedules_stepping_optimizer``: every optimizer a
schedule stepped since the previous optimizer step is still trained — it is this one, or
one stepped since any other optimizer over its parameters began stepping (before the
schedule's step: the last step of a finished stage's schedule is fine), or, not yet
stepped, it holds parameters of a model the run runs (a generator whose schedule is
stepped before the critic's first cycles end is fine).  An optimizer built over another's
very parameter groups (a wrapper, SAM's base optimizer) is that optimizer.
"""

from __future__ import annotations

import weakref
from typing import Callable

import torch

from .params import same_groups
from .schedule_cadence import stepped_optimizer


def _same(one: torch.optim.Optimizer, other: torch.optim.Optimizer) -> bool:
    return one is other or same_groups(one.param_groups, other.param_groups)


def _param_ids(optimizer: torch.optim.Optimizer) -> set[int]:
    return {id(p) for group in optimizer.param_groups for p in group.get("params", ())}


class ScheduleTargets:
    """The optimizers schedules wrote into since the latest optimizer step, and when each
    optimizer that steps first and last stepped."""

    def __init__(self) -> None:
        #: (optimizer, optimizer steps taken before the schedule wrote into it)
        self._written: list[tuple[weakref.ref[torch.optim.Optimizer], int]] = []
        self._first: "weakref.WeakKeyDictionary[torch.optim.Optimizer, int]" = weakref.WeakKeyDictionary()
        self._last: "weakref.WeakKeyDictionary[torch.optim.Optimizer, int]" = weakref.WeakKeyDictionary()
        self._serial = 0

    def scheduler_stepped(self, scheduler: object) -> None:
        optimizer = getattr(scheduler, "optimizer", None)
        if isinstance(optimizer, torch.optim.Optimizer):
            self._written.append((weakref.ref(stepped_optimizer(optimizer)), self._serial))

    def schedules_stepping_optimizer(self, optimizer: torch.optim.Optimizer,
                                     in_model: Callable[[torch.Tensor], bool]) -> bool | None:
        """Judged before each optimizer step (None: no schedule stepped since the previous one)."""
        self._serial += 1
        self._first.setdefault(optimizer, self._serial)
        self._last[optimizer] = self._serial
        written, self._written = self._written, []
        targets = {id(target): (target, serial) for target, serial in ((ref(), at) for ref, at in written)
                   if target is not None}
        if not targets:
            return None
        return all(self._trained(target, serial, in_model) for target, serial in targets.values())

    def _trained(self, target: torch.optim.Optimizer, written_at: int,
                 in_model: Callable[[torch.Tensor], bool]) -> bool:
        """Whether ``target`` was still trained when a schedule wrote into it, ``written_at``
        optimizer steps into the run (a schedule's last step after its optimizer's last one,
        before a new stage's optimizer starts, is fine)."""
        stepped = list(self._last.items())
        own = [serial for other, serial in stepped if _same(other, target)]
        if not own:
            # a new optimizer whose schedule is built before its first step (a stage after
            # a pre-training stage over the same parameters) is fine; a copy holds no model's
            return any(in_model(p) for group in target.param_groups for p in group.get("params", ()))
        last = max(own)
        later = [other for other, _ in stepped
                 if last < self._first.get(other, 0) <= written_at and not _same(other, target)]
        if not later:
            return True
        params = _param_ids(target)  # replaced: another over its parameters began stepping since
        return not any(params & _param_ids(other) for other in later)
