"""Cosine schedules stepped past their horizon.

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
The schedule helpers of ``transformers`` (``get_cosine_schedule_with_warmup`` and its
linear, polynomial and restarting siblings) are ``LambdaLR``s over a
``functools.partial`` that names its ``num_training_steps``: past it their cosine climbs
back too, and the others sit at zero or at their floor, so the same horizon is judged.

A schedule stepped once more after the last optimizer step (a loop that steps it
after its final epoch) is past its horizon harmlessly and is never judged: the
contract is read at optimizer steps.  Nor is an overrun of a tenth of the horizon: a
loop that sizes its schedule with floor division (``len(loader) // accumulation``
steps an epoch) and also steps on each epoch's tail runs a few steps past it, and the
rate rises by a few hundredths of its base there, while a horizon in the wrong unit is
overrun by a factor.  A cosine inside a ``SequentialLR`` is judged
too: the wrapper restarts it from epoch 0 at its milestone, so its horizon counts from
the hand-over, and a horizon too short there climbs back just the same.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch
from torch.optim.lr_scheduler import CosineAnnealingLR, LambdaLR

from .schedule_cadence import stepped_optimizer

#: share of the horizon a schedule may run past it (a loop stepping epoch tails its size left out)
OVERRUN_SHARE = 0.1


class ScheduleHorizons:
    """The horizon schedules (cosine, transformers helpers) the program stepped over each optimizer."""

    def __init__(self) -> None:
        self._schedules: "weakref.WeakKeyDictionary[torch.optim.Optimizer, weakref.WeakSet[Any]]" = (
            weakref.WeakKeyDictionary())

    def scheduler_stepped(self, scheduler: Any) -> None:
        optimizer = getattr(scheduler, "optimizer", None)
        if horizon_of(scheduler) is not None and isinstance(optimizer, torch.optim.Optimizer):
            self._schedules.setdefault(stepped_optimizer(optimizer), weakref.WeakSet()).add(scheduler)

    def anneals_within_horizon(self, optimizer: torch.optim.Optimizer) -> bool | None:
        """None where no horizon schedule over ``optimizer`` was stepped."""
        schedules = self._schedules.get(optimizer)
        if not schedules:
            return None
        judged = [(s.last_epoch, horizon_of(s)) for s in schedules if isinstance(s.last_epoch, int)]
        judged = [(epoch, horizon) for epoch, horizon in judged if horizon is not None]
        if not judged:
            return None
        return all(epoch <= horizon + max(1.0, horizon * OVERRUN_SHARE) for epoch, horizon in judged)


def horizon_of(scheduler: Any) -> float | None:
    """The number of its own steps a schedule anneals over (None: not a horizon schedule)."""
    if isinstance(scheduler, CosineAnnealingLR):
        horizon = scheduler.T_max
    elif isinstance(scheduler, LambdaLR) and scheduler.lr_lambdas:
        horizons = {_named_horizon(function) for function in scheduler.lr_lambdas}
        horizon = horizons.pop() if len(horizons) == 1 else None
    else:
        return None
    return horizon if isinstance(horizon, (int, float)) and horizon > 0 else None


def _named_horizon(function: Any) -> Any:
    """``num_training_steps`` of a ``transformers`` schedule's partial."""
    if isinstance(function, functools.partial):
        return function.keywords.get("num_training_steps")
    return None
