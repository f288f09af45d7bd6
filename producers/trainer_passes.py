"""Optimizer calls a trainer makes on purpose without a backward.

Lightning's ``StochasticWeightAveraging`` ends training with one more pass over the
training data to recompute BatchNorm statistics for the averaged weights.  It runs that
pass through the ordinary training loop with backward switched off
(``fit_loop._skip_backward``), so the trainer still calls ``clip_grad_norm_`` and
``optimizer.step`` once at its end, on parameters that hold no gradient: both are
no-ops by design, on weights the callback has just replaced.  Recorded, they read as a
step that forgot its backward and updated nothing — the very bugs those rules exist
for.  So those two calls are not recorded while a trainer skips backward; the pass's
forwards still are, and the session summary counts the calls left out, so the verdict
does not claim them.

The flag is read from the caller's frames: Lightning's automatic-optimization loop
(``_AutomaticOptimization``, its ``_skip_backward`` attribute) is on the stack of
every optimizer call it makes.  Only looked for once Lightning is imported.
"""

from __future__ import annotations

import sys

#: the Lightning module whose loop drives automatic optimization
_LIGHTNING_LOOP = "lightning.pytorch.loops.optimization.automatic"
_LOOP_CLASS = "_AutomaticOptimization"
#: how far up the stack the loop's frame is looked for
_FRAMES_TO_LOOP = 24


def trainer_skips_backward() -> bool:
    """Whether the optimizer call being made comes from a trainer pass run without
    backward (Lightning's ``_skip_backward``).  Frames are told apart by their module's
    name, read without building their locals; only the loop's own frame has its
    ``self`` looked up."""
    if _LIGHTNING_LOOP not in sys.modules:
        return False
    frame = sys._getframe(1)
    for _ in range(_FRAMES_TO_LOOP):
        if frame is None:
            return False
        if frame.f_globals.get("__name__") == _LIGHTNING_LOOP:
            owner = frame.f_locals.get("self")
            if type(owner).__name__ == _LOOP_CLASS:
                return getattr(owner, "_skip_backward", False) is True
        frame = frame.f_back
    return False


class LeftOutCalls:
    """The calls left out so far, and the optimizer steps under way that were."""

    def __init__(self) -> None:
        self.count = 0
        self._steps: set[int] = set()

    def clip(self) -> bool:
        """Before ``clip_grad_norm_``: True when it is left out (counted)."""
        if not trainer_skips_backward():
            return False
        self.count += 1
        return True

    def step_begins(self, optimizer: object) -> bool:
        """Before ``optimizer.step``: True when it is left out (counted), so its end is too."""
        if not trainer_skips_backward():
            return False
        self.count += 1
        self._steps.add(id(optimizer))
        return True

    def step_ended(self, optimizer: object) -> bool:
        """After ``optimizer.step``: True for a step whose beginning was left out."""
        if id(optimizer) not in self._steps:
            return False
        self._steps.discard(id(optimizer))
        return True
