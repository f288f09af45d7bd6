"""Gradients cleared before any optimizer used them.

Clearing an optimizer's gradients between a backward pass and the next optimizer step
throws that backward's work away.  Inside gradient accumulation it is the classic
mistake: ``optimizer.zero_grad()`` left inside the micro-batch loop, or
``model.zero_grad()`` where only the wrapped optimizer's clear is skipped on
accumulating micro-steps (alpaca_farm issue 57), and each update sees only the last
micro-batch while the loss looks normal.  Healthy loops clear after the step or before
the forward: no backward ran since the last step of any optimizer.  A GAN's generator
backward reaches the discriminator's parameters too, but the generator's step uses it
before the discriminator's next clear.

So each ``zero_grad`` that clears the gradients of optimizers that have stepped before
carries a contract (``clears_used_grads`` on ``Optimizer.zero_grad``,
``module_clears_used_grads`` on ``Module.zero_grad``): it does not clear finite, non-zero
gradients of theirs that a backward since the last optimizer step produced — unless it is
the only such clear between two steps, the previous two included: one discarded
backward is a step skipped on purpose (a guard, the tail of an epoch whose length the
accumulation does not divide), a clear in every micro-batch is not.  So accumulation
over three or more micro-batches is reported in its first cycle, over two in its
second.  Not judged (None): optimizers before their first step (a sanity backward during
setup), clears inside a step (closures) or inside an optimizer's own update method
(sharpness-aware minimisation's ``first_step``), and a backward whose gradients the
program then inspected (``clip_grad_norm_``: a step skipped on a gradient-norm spike) or
that ran through a model input requiring gradients (adversarial training computes
input gradients with a backward whose parameter gradients it discards).  Gradients that
are not finite (a step skipped on overflow, by ``GradScaler`` or by hand) are not a
wasted update either.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable

import torch

from .param_snapshots import tensor_norms

#: how far up an input's autograd graph a plain tensor that requires gradients is looked for
INPUT_GRAPH_DEPTH = 4


def _leads_to_plain_leaf(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is, or is computed within a few operations from, a leaf that
    requires gradients and is not a parameter (an input perturbation, an image being
    optimised)."""
    if tensor.is_leaf:
        return not isinstance(tensor, torch.nn.Parameter)
    frontier = [tensor.grad_fn]
    for _ in range(INPUT_GRAPH_DEPTH):
        upstream = []
        for node in frontier:
            for parent, _ in getattr(node, "next_functions", ()):
                if parent is None:
                    continue
                variable = getattr(parent, "variable", None)
                if variable is not None:
                    if not isinstance(variable, torch.nn.Parameter):
                        return True
                else:
                    upstream.append(parent)
        frontier = upstream
    return False


def _wasted(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer holds finite gradients that are not all zero (one norm
    kernel per dtype and device, read back at once: only reached when a clear follows an
    unused backward)."""
    grads = [p.grad for group in optimizer.param_groups for p in group.get("params", ())
             if isinstance(p, torch.Tensor) and p.grad is not None and not p.grad.is_sparse]
    norms = [norm for norm in tensor_norms(grads) if norm is not None]
    return bool(norms) and all(math.isfinite(norm) for norm in norms) and any(norm > 0 for norm in norms)


class WastedGrads:
    """Whether a backward ran since the last optimizer step or clear whose gradients
    nothing used yet, and whether the program inspected them or took input gradients
    since."""

    def __init__(self) -> None:
        self._unused_backward = False
        self._excused = False  # inspected (clip) or input gradients since the last step
        self._wipes = 0  # clears that discarded gradients since the last optimizer step
        self._wiped_before = False  # and between the two steps before

    def backward_ran(self) -> None:
        self._unused_backward = True

    def optimizer_stepped(self) -> None:
        self._unused_backward = False
        self._excused = False
        self._wiped_before, self._wipes = self._wipes > 0, 0

    def inspected(self) -> None:
        self._excused = True

    def model_inputs(self, args: Iterable[Any]) -> None:
        """At a model's forward with gradients: note inputs that require gradients."""
        if self._excused:
            return
        for arg in args:
            if isinstance(arg, torch.Tensor) and arg.requires_grad and _leads_to_plain_leaf(arg):
                self._excused = True
                return

    def clears_used_grads(self, optimizers: list[torch.optim.Optimizer],
                          inside_update: Callable[[], bool]) -> bool | None:
        """Judged before a clear of ``optimizers``' gradients (those that have stepped);
        ``inside_update`` (asked only after an unused backward) tells a clear made by an
        optimizer's own update method."""
        if not optimizers:
            return None
        if not self._unused_backward:
            return True
        if inside_update():
            return None
        try:
            if self._excused or not any(_wasted(optimizer) for optimizer in optimizers):
                return None if self._excused else True
            self._wipes += 1
            return False if self._wipes > 1 or self._wiped_before else None  # one may be a skipped step
        finally:  # what the backward left is gone now
            self._unused_backward = self._excused = False
