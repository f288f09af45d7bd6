"""Cosine annealing stepped past its horizon.

``CosineAnnealingLR(optimizer, T_max)`` anneals the rate from its base to ``eta_min``
over ``T_max`` of its own steps, and past that point its closed form keeps following
the cosine: the rate climbs back to the base rate over the next ``T_max`` steps, falls
again, and so on.  Nothing warns.  The usual cause is a horizon counted in epochs for
a schedule stepped per batch (ScrollPrize/villa PR 1495), or in optimizer steps for a
schedule stepped per micro-batch: training runs through several cycles of warm
restarts nobody asked for, at full rate when it should be finishing.  Schedules meant
to restart say so (``CosineAnnealingWarmRestarts``, ``OneCycleLR`` refuses to go past
its total), so each optimizer step carries the contract ``anneals_within_horizon``:
every ``CosineAnnealingLR`` stepped over the optimizer is still within its ``T_max``.

A schedule stepped once more after the last optimizer step (a loop that steps it
after its final epoch) is past its horizon harmlessly and is never judged: the
contract is read at optimizer steps.  A cosine inside a ``SequentialLR`` is judged
too: the wrapper restarts it from epoch 0 at its milestone, so its horizon counts from
the hand-over, and a horizon too short there climbs back just the same.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.optim.lr_scheduler import CosineAnnealingLR

from .schedule_cadence import stepped_optimizer


class CosineHorizons:
    """The cosine schedules the program stepped over each optimizer."""

    def __init__(self) -> None:
        self._schedules: "weakref.WeakKeyDictionary[torch.optim.Optimizer, weakref.WeakSet[Any]]" = (
            weakref.WeakKeyDictionary())

    def scheduler_stepped(self, scheduler: Any) -> None:
        optimizer = getattr(scheduler, "optimizer", None)
        if isinstance(scheduler, CosineAnnealingLR) and isinstance(optimizer, torch.optim.Optimizer):
            self._schedules.setdefault(stepped_optimizer(optimizer), weakref.WeakSet()).add(scheduler)

    def anneals_within_horizon(self, optimizer: torch.optim.Optimizer) -> bool | None:
        """None where no cosine schedule over ``optimizer`` was stepped."""
        schedules = self._schedules.get(optimizer)
        if not schedules:
            return None
        judged = [(s.last_epoch, s.T_max) for s in schedules
                  if isinstance(s.last_epoch, int) and isinstance(s.T_max, (int, float)) and s.T_max > 0]
        if not judged:
            return None
        return all(epoch <= horizon for epoch, horizon in judged)
