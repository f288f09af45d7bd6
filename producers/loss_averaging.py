"""Gradient accumulation whose micro-batch losses are summed instead of averaged.

Accumulating gradients over k micro-batches before one optimizer step is meant to give
the gradient of one k-times larger batch: each micro-batch's loss is divided by k (or by
the step's total token count) before ``backward``.  Forgetting the division hands the
optimizer the sum of k mean gradients, a k-fold learning rate that no loss curve shows as
an error (fastai#3023, transformers#37766, nanoGPT#206).  Trainer frameworks divide for
the user (Hugging Face ``Trainer``, Lightning, accelerate's ``backward``, DeepSpeed), so
the loss they hand to ``backward`` ends in a division or a multiplication; a hand-written
loop that forgets ends in the loss function itself.

So each backward outside an optimizer step notes whether its loss was rescaled (the
last operation of its graph, beyond a ``GradScaler``'s multiplication, is a division or
a multiplication on every summand) and what that operation is.  At an optimizer step
the backwards since that optimizer's previous step or clear form its cycle, and the
contract ``averages_accumulated_losses`` holds unless the cycle accumulates two or more
losses that were not rescaled, all ending in the same operation, and something says
they are micro-batches of one step:

- each came from a batch of its own (a DataLoader yielded a batch between them), or
- the same optimizer's earlier steps took one such loss each (accumulation switched on
  mid-run, to save memory or to ramp the batch size, without the division).

Two losses of one batch (a GAN discriminator's real and fake halves, an auxiliary loss
with its own backward) are a sum by design and are not judged.  A single such cycle is
not judged either (a step skipped after its backward by a guard that does not clear),
nor one with a loss that is not finite (an overflow skipped): the optimizer's previous
step must have accumulated the same way.  Reading a loss value, the only host read, is
done only for a cycle about to be reported.
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch


#: autograd nodes that rescale a loss (``loss / k``, ``loss * (n / total)``)
RESCALING_NODES = frozenset({"DivBackward0", "DivBackward1", "MulBackward0", "MulBackward1"})
#: autograd nodes of a sum of losses: rescaled when every summand is
SUM_NODES = frozenset({"AddBackward0", "AddBackward1", "SubBackward0", "SubBackward1"})
#: backwards remembered: more than any accumulation cycle judged needs
HISTORY = 256


@dataclass(frozen=True)
class LossFacts:
    """What a backward's loss says about accumulation."""

    serial: int  # the backward's number in this process
    batch: int  # DataLoader batches yielded before it
    training_pass: int  # training DataLoader passes begun before it
    rescaled: bool
    last_operation: str
    value: torch.Tensor | None  # the loss, detached (read only for a cycle about to be reported)


def _rescaled(node: Any, depth: int = 4) -> bool:
    """Whether every summand of the loss ``node`` computes ends in a rescaling."""
    name = type(node).__name__
    if name in RESCALING_NODES:
        return True
    if name not in SUM_NODES or depth == 0:
        return False
    summands = [parent for parent, _ in node.next_functions if parent is not None]
    return bool(summands) and all(_rescaled(parent, depth - 1) for parent in summands)


class AccumulatedLosses:
    """The backwards of each optimizer's current cycle, and its cycles before."""

    def __init__(self) -> None:
        self._serial = 0
        self._batches = 0
        self._training_passes = 0
        self._losses: deque[LossFacts] = deque(maxlen=HISTORY)
        self._cycle_start: dict[str, int] = {}  # optimizer name -> last serial before its cycle
        self._stepped_at: dict[str, int] = {}  # optimizer name -> latest serial at its latest step
        self._single_losses: dict[str, set[str]] = {}  # last operations of one-loss cycles
        self._suspected: set[str] = set()  # optimizers whose previous cycle looked summed
        self._discarded_pass: dict[str, int] = {}  # optimizer -> pass of the latest backward a clear discarded
        self._scaler_output: "weakref.ref[torch.Tensor] | None" = None

    @property
    def serial(self) -> int:
        """How many backwards outside an optimizer step this process ran."""
        return self._serial

    def batch_yielded(self) -> None:
        self._batches += 1

    def training_pass_begun(self) -> None:
        self._training_passes += 1

    def loss_scaled(self, output: Any) -> None:
        """``GradScaler.scale`` returned ``output``: its multiplication is not a rescaling."""
        if isinstance(output, torch.Tensor):
            self._scaler_output = weakref.ref(output)

    def backward(self, loss: Any) -> None:
        """A backward outside an optimizer step starts from ``loss``."""
        if isinstance(loss, (list, tuple)):
            loss = loss[0] if loss else None
        if not isinstance(loss, torch.Tensor) or loss.grad_fn is None:
            return
        self._serial += 1
        node = loss.grad_fn
        scaler_output = self._scaler_output() if self._scaler_output is not None else None
        if scaler_output is loss and node.next_functions and node.next_functions[0][0] is not None:
            node = node.next_functions[0][0]
        if loss.numel() != 1:  # a backward from an output with a given gradient: no loss to judge
            self._losses.append(LossFacts(self._serial, self._batches, self._training_passes, True,
                                          type(node).__name__, None))
            return
        self._losses.append(LossFacts(self._serial, self._batches, self._training_passes, _rescaled(node),
                                      type(node).__name__, loss.detach()))

    def cleared(self, optimizer_names: list[str]) -> None:
        """The gradients of these optimizers were cleared: their cycles start again."""
        for name in optimizer_names:
            if self._serial > self._cycle_start.get(name, 0) and self._losses:
                self._discarded_pass[name] = self._losses[-1].training_pass
            self._cycle_start[name] = self._serial

    def cut_by_new_pass(self, optimizer_name: str, cycle: list[LossFacts]) -> bool:
        """At the optimizer's step (asked once a step): whether a clear since its previous
        step discarded backwards of a training pass before the one its cycle began in."""
        discarded_pass = self._discarded_pass.pop(optimizer_name, None)
        return discarded_pass is not None and bool(cycle) and cycle[0].training_pass > discarded_pass

    def take_cycle(self, optimizer_name: str) -> list[LossFacts]:
        """At the step of the optimizer named ``optimizer_name`` (``opt<i>``): the backwards
        since its previous step or clear; its next cycle starts now."""
        start = self._cycle_start.get(optimizer_name, 0)
        self._cycle_start[optimizer_name] = self._serial
        self._stepped_at[optimizer_name] = self._serial
        # serials grow along the deque: read back from its end, not the whole history at every step
        return list(itertools.takewhile(lambda loss: loss.serial > start, reversed(self._losses)))[::-1]

    def own_part(self, optimizer_name: str, cycle: list[LossFacts]) -> list[LossFacts]:
        """The backwards of ``cycle`` (taken just now) after the latest step of any other
        optimizer: those before it fed that step (three optimizers over one model, each
        stepping after its own loss, leave each other's backwards in a cycle that no clear
        cut), so they are no micro-batches of this one's accumulation."""
        others = max((serial for name, serial in self._stepped_at.items() if name != optimizer_name), default=0)
        return [loss for loss in cycle if loss.serial > others]

    def averages_accumulated_losses(self, optimizer_name: str, cycle: list[LossFacts]) -> bool | None:
        """Judged at the step of the optimizer named ``optimizer_name`` over its cycle."""
        if len(cycle) < 2 or any(loss.rescaled for loss in cycle):
            self._suspected.discard(optimizer_name)
            if len(cycle) == 1 and not cycle[0].rescaled:
                self._single_losses.setdefault(optimizer_name, set()).add(cycle[0].last_operation)
            return True
        operations = {loss.last_operation for loss in cycle}
        own_batches = all(later.batch > earlier.batch for earlier, later in zip(cycle, cycle[1:]))
        switched_on = operations <= self._single_losses.get(optimizer_name, set())
        if len(operations) > 1 or not (own_batches or switched_on):
            self._suspected.discard(optimizer_name)
            return True
        suspected_before = optimizer_name in self._suspected
        self._suspected.add(optimizer_name)
        if not suspected_before:
            return None
        finite = all(loss.value is None or math.isfinite(float(loss.value)) for loss in cycle)
        return False if finite else None

