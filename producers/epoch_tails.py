"""Micro-batch gradients left over from one epoch and stepped in the next.

A hand-written accumulation loop that steps when ``(i + 1) % k == 0`` and clears only
after its steps leaves the gradients of an epoch's trailing micro-batches in ``.grad``
when the epoch's length is not a multiple of k (LLMs-from-scratch PR 300, Lightning
question 4653).  Nothing clears them, so the first step of the next epoch applies
k + r micro-batches, r of them computed with the previous epoch's weights, and the
tail of every epoch is never a step of its own.  Healthy loops step on the tail (Hugging
Face ``Trainer``, Lightning, accelerate's ``accumulate`` all do), clear at the start of
an epoch, or count micro-batches over the whole run so that a cycle crossing the epoch
boundary still holds k of them.

The opposite mistake wipes the tail: a loop that counts micro-batches over the whole
run, so that a cycle crosses the epoch boundary on purpose, and also clears at the start
of every epoch (ultralytics PR 11217) steps the first cycle of each epoch on only the
micro-batches that followed the clear.

So each optimizer step carries the contract ``carries_no_epoch_tail``: a cycle (the
backwards since that optimizer's previous step or clear, from
`producers.loss_averaging`) that began in an earlier training pass than the one it ends
in holds no more backwards than the optimizer's longest cycle within one pass.  Not
judged before the optimizer has completed a cycle within one pass, nor in programs that
begin a DataLoader pass for every batch (``next(iter(loader))``): their cycles never lie
within one pass.  And ``keeps_cycle_across_epoch``: a step whose cycle began in a later
training pass than the backwards a clear since the previous step discarded holds as
many backwards as the optimizer's longest cycle within one pass, where that is two or
more (a clear at an epoch's start that drops a tail the loop never steps leaves the next
cycle whole).
"""

from __future__ import annotations

from typing import Sequence

from .loss_averaging import LossFacts


class EpochTails:
    """Each optimizer's longest accumulation cycle within one training pass."""

    def __init__(self) -> None:
        self._longest_in_pass: dict[str, int] = {}

    def carries_no_epoch_tail(self, optimizer_name: str, cycle: Sequence[LossFacts]) -> bool | None:
        """Judged at the step of the optimizer named ``optimizer_name`` over its cycle."""
        if not cycle:
            return True
        longest = self._longest_in_pass.get(optimizer_name)
        if cycle[0].training_pass == cycle[-1].training_pass:
            self._longest_in_pass[optimizer_name] = max(longest or 0, len(cycle))
            return True
        if longest is None:
            return None
        return len(cycle) <= longest

    def keeps_cycle_across_epoch(self, optimizer_name: str, cycle: Sequence[LossFacts], cut_by_new_pass: bool) -> bool | None:
        """Judged at the step after ``carries_no_epoch_tail``; ``cut_by_new_pass``: a clear
        since the optimizer's previous step discarded backwards of a pass before the one
        the cycle began in."""
        if not cut_by_new_pass:
            return True
        longest = self._longest_in_pass.get(optimizer_name)
        if longest is None or longest < 2:
            return None
        return len(cycle) >= longest
