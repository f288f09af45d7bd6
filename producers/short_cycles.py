"""Accumulation cycles cut short again and again inside one training pass.

Gradient accumulation over k micro-batches steps once per k backwards; the last cycle
of a pass may be shorter (the loader's length is not a multiple of k), once.  accelerate
syncs with the loader by default, so a loop that splits each loaded batch into
micro-batches inside ``accelerator.accumulate`` gets a forced sync on every micro-batch
of the loader's last batch (accelerate#1847): each of them steps alone, the update is
taken on a quarter of the intended batch several times over, and a schedule counted in
planned steps runs out early.  Any "step at the end of the batch" condition that fires
on every micro-batch does the same.

So each optimizer step whose cycle lies within one training pass carries
``steps_whole_cycles`` once that pass has shown a fixed accumulation: `ESTABLISHED`
cycles of one length k of two or more, and no other before them.  It
breaks on the second cycle shorter than k in that pass: one short cycle is the pass's
tail.  Passes whose cycles vary (accumulation to a token budget), cycles that span two
passes, and steps without accumulation (k = 1) are not judged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .loss_averaging import LossFacts

#: cycles of one length a pass must begin with before its accumulation counts as fixed
ESTABLISHED = 2


@dataclass
class _PassCycles:
    """One optimizer's cycles in the training pass in progress."""

    training_pass: int
    length: int  # of its cycles so far; 0 once they differed
    full: int  # cycles of that length
    short: int  # shorter ones after them


class ShortCycles:
    """Per optimizer (``opt<i>``), the cycles of the training pass in progress."""

    def __init__(self) -> None:
        self._passes: dict[str, _PassCycles] = {}

    def steps_whole_cycles(self, optimizer_name: str, cycle: Sequence[LossFacts]) -> bool | None:
        """Judged at the step of ``optimizer_name`` over ``cycle`` (its backwards)."""
        if not cycle or cycle[0].training_pass != cycle[-1].training_pass:
            return None
        training_pass = cycle[0].training_pass
        seen = self._passes.get(optimizer_name)
        if seen is None or seen.training_pass != training_pass:
            self._passes[optimizer_name] = _PassCycles(training_pass, len(cycle), 1, 0)
            return None
        established = seen.length >= 2 and seen.full >= ESTABLISHED
        if seen.short == 0 and len(cycle) == seen.length:
            seen.full += 1
            return True if established else None
        if not established:
            seen.length = 0  # cycles of several lengths: not a fixed accumulation
            return None
        if len(cycle) >= seen.length:
            seen.length = 0  # longer again after a short one: not the pattern judged here
            return None
        seen.short += 1
        return seen.short < 2
