"""Whether a backward ran since an optimizer's previous step.

The ordering rule "a backward comes before each optimizer step" is judged within a
step window, whose boundary is the producer's guess at where an iteration starts.  With
several optimizers the guess can fall between a backward and the step it fed: a WGAN
iteration back-propagates both critics' losses, then steps them one after the other,
and the second critic's step may open a window of its own.  So each step says whether
a backward ran since that optimizer's previous step (``fed``), which the rule counts as
a backward before it wherever the window boundary fell.  A step nothing fed since its
previous one (the missing ``loss.backward()``) still says so.
"""

from __future__ import annotations

import weakref

import torch


class FedSteps:
    """The backwards run so far, and how many had run at each optimizer's latest step."""

    def __init__(self) -> None:
        self._backwards = 0
        self._at_step: "weakref.WeakKeyDictionary[torch.optim.Optimizer, int]" = weakref.WeakKeyDictionary()

    def backward(self) -> None:
        self._backwards += 1

    def fed(self, optimizer: torch.optim.Optimizer) -> bool:
        """At a step: whether a backward ran since the optimizer's previous step."""
        fed = self._backwards > self._at_step.get(optimizer, 0)
        self._at_step[optimizer] = self._backwards
        return fed
