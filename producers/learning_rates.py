"""An optimizer that keeps stepping after its learning rate has fallen to zero.

A schedule sized for fewer steps than the run (``num_training_steps`` computed for one
epoch of three, a ``LambdaLR`` clamped at zero, a polynomial decay that ends early)
leaves every learning rate at 0 for the rest of training: the optimizer steps, nothing
changes, the loss flattens and looks converged.  Healthy schedules may start at zero
(warm-up) and may touch zero for one step (the end of a decay, a cosine cycle's
minimum); they never step at zero twice in a row once they have learned.  So the
contract breaks on the second consecutive step whose rates are all zero after a step
with a positive one.  Only plain-number rates are read: a tensor rate (capturable
optimizers) may live on an accelerator, and reading it would block the step.
"""

from __future__ import annotations

import numbers
import weakref

import torch

#: consecutive all-zero steps a schedule may take once it has learned (its last step)
ZERO_STEPS_ALLOWED = 1


def plain_rates(optimizer: torch.optim.Optimizer) -> list[float] | None:
    """The groups' learning rates, or None when any is not a plain number.  NumPy scalars
    count: schedules computed as arrays (DINO's and MAE's ``cosine_scheduler``) write
    ``np.float64`` values into the groups."""
    rates = [group.get("lr") for group in optimizer.param_groups]
    if not rates or not all(isinstance(rate, numbers.Real) and not isinstance(rate, bool) for rate in rates):
        return None
    return [float(rate) for rate in rates]


def all_rates_zero(optimizer: torch.optim.Optimizer) -> bool:
    """Every group's (plain-number) learning rate is zero: its step changes nothing."""
    rates = plain_rates(optimizer)
    return rates is not None and all(rate == 0 for rate in rates)


class LearningRates:
    """Per optimizer: whether it has stepped with a positive rate, and its zero streak."""

    def __init__(self) -> None:
        self._learned: "weakref.WeakSet[torch.optim.Optimizer]" = weakref.WeakSet()
        self._zero_streak: "weakref.WeakKeyDictionary[torch.optim.Optimizer, int]" = weakref.WeakKeyDictionary()

    def keeps_learning(self, optimizer: torch.optim.Optimizer) -> bool | None:
        """Judged at each step (None: rates this tracker does not read)."""
        rates = plain_rates(optimizer)
        if rates is None:
            return None
        if any(rate != 0 for rate in rates):
            self._learned.add(optimizer)
            self._zero_streak[optimizer] = 0
            return True
        if optimizer not in self._learned:
            return True  # a warm-up that starts from zero
        streak = self._zero_streak.get(optimizer, 0) + 1
        self._zero_streak[optimizer] = streak
        return streak <= ZERO_STEPS_ALLOWED
