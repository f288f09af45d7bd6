"""Learning-rate schedules stepped more often than their optimizer.

A schedule counts its own ``step()`` calls: stepped on every micro-batch of a gradient
accumulation loop whose optimizer steps once per k of them, it runs k times too fast.
accelerate fixed this for schedulers handed to ``prepare`` (accelerate issue 963, PR
999); one built after ``prepare``, or a hand-written accumulation loop that steps the
schedule outside its ``if (i + 1) % k == 0`` block, still does it, and so does a
schedule stepped both in the batch loop and at the end of each epoch.  Nothing fails:
the warm-up ends early, the decay starts early, the run ends at the floor rate.

So each optimizer step carries the contract ``steps_schedule_with_optimizer``: the
rates it steps with were not changed since its previous step by a schedule over it that
was stepped more than once in between.  A schedule that holds its rate (the stable
phase of a stable-then-decay schedule) is not yet wrong, so the contract breaks at the
first step whose rate it moved.  Not judged: an optimizer's first step (a resumed run may
fast-forward its schedule first), steps a ``GradScaler`` skipped (each ``update`` counts
as an attempted step), the extra calls accelerate's ``AcceleratedScheduler`` makes on
purpose (one per process, for a dataloader sharded across them), and rates that are not
plain numbers.

Rates written by hand between two steps (no schedule stepped) are judged too, by
``rescales_groups_alike``: such a change moves every parameter group's rate the same
way.  A decay helper that writes one rate into every group (``for g in
optimizer.param_groups: g["lr"] = lr``, PENet issue 29) raises the smaller rates of a
discriminative setup (a backbone at a tenth of the head's rate) while it lowers the
larger ones, and the ratio the groups were built with is gone.  Decays, warm-ups and
restarts written by hand move all groups alike, and a group unfrozen from rate 0 may
rise while the others fall.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import torch

from .learning_rates import plain_rates

#: how far up the stack a schedule's step looks for accelerate's scheduler wrapper
_FRAMES_TO_WRAPPER = 6


def _stepped_by_accelerate(frame: Any) -> bool:
    for _ in range(_FRAMES_TO_WRAPPER):
        if frame is None:
            return False
        if frame.f_globals.get("__name__", "").startswith("accelerate.scheduler"):
            return True
        frame = frame.f_back
    return False


def stepped_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer whose ``step`` runs for a wrapper a schedule may be built over
    (accelerate's ``AcceleratedOptimizer`` keeps it as ``optimizer``, Lightning's
    ``LightningOptimizer`` as ``_optimizer``)."""
    for _ in range(4):
        inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
        if not isinstance(inner, torch.optim.Optimizer) or inner is optimizer:
            return optimizer
        optimizer = inner
    return optimizer


class ScheduleCadence:
    """Per optimizer: how often each schedule over it was stepped since its latest step,
    the rates of that step, and the loss-scale updates counted then."""

    def __init__(self) -> None:
        self._calls: "weakref.WeakKeyDictionary[torch.optim.Optimizer, dict[int, int]]" = weakref.WeakKeyDictionary()
        self._rates: "weakref.WeakKeyDictionary[torch.optim.Optimizer, list[float]]" = weakref.WeakKeyDictionary()
        self._updates_at_step: "weakref.WeakKeyDictionary[torch.optim.Optimizer, int]" = weakref.WeakKeyDictionary()
        self._via_accelerate: "weakref.WeakSet[Any]" = weakref.WeakSet()

    def scheduler_stepped(self, scheduler: Any) -> None:
        """Before a ``step()`` of ``scheduler`` other than the one its constructor takes."""
        optimizer = getattr(scheduler, "optimizer", None)
        epoch = getattr(scheduler, "last_epoch", None)
        if not isinstance(optimizer, torch.optim.Optimizer) or not isinstance(epoch, int) or epoch < 0:
            return
        if scheduler in self._via_accelerate or _stepped_by_accelerate(sys._getframe(1)):
            self._via_accelerate.add(scheduler)
            return
        calls = self._calls.setdefault(stepped_optimizer(optimizer), {})
        calls[id(scheduler)] = calls.get(id(scheduler), 0) + 1

    def judge_step(self, optimizer: torch.optim.Optimizer, scaler_updates: int) -> tuple[bool | None, bool | None]:
        """``steps_schedule_with_optimizer`` and ``rescales_groups_alike``, judged before
        each step of ``optimizer`` (None: not judged)."""
        rates = plain_rates(optimizer)
        previous = self._rates.get(optimizer)
        updates_before = self._updates_at_step.get(optimizer, scaler_updates)
        calls = self._calls.pop(optimizer, None)
        self._updates_at_step[optimizer] = scaler_updates
        if rates is None:
            self._rates.pop(optimizer, None)
            return None, None
        self._rates[optimizer] = rates
        if previous is None or len(previous) != len(rates):
            return None, None
        if calls:
            attempted = max(1, scaler_updates - updates_before)
            return rates == previous or max(calls.values()) <= attempted, None
        return None, _moved_alike(previous, rates)


def _moved_alike(previous: list[float], rates: list[float]) -> bool | None:
    """Whether rates written by hand since the previous step (no schedule stepped) raised
    no positive group's rate while lowering another's (None: a single group)."""
    if len(rates) < 2:
        return None
    raised = any(0 < before < now for before, now in zip(previous, rates))
    lowered = any(now < before for before, now in zip(previous, rates))
    return not (raised and lowered)
