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
setup; `producers.unstepped_optimizers` judges those that never step while others do), clears inside a step (closures) or inside an optimizer's own update method
(sharpness-aware minimisation's ``first_step``), and a backward whose gradients the
program then inspected (``clip_grad_norm_``: a step skipped on a gradient-norm spike) or
that ran through a model input requiring gradients (adversarial training computes
input gradients with a backward whose parameter gradients it discards), and a backward
that kept its graph for the next objective of the same forward
(`producers.retained_graphs`: gradient surgery copies each objective's gradients).  Gradients that
are not finite (a step skipped on overflow, by ``GradScaler`` or by hand) are not a
wasted update either, nor are gradients the program used to move the weights before
clearing them: sharpness-aware minimisation written in the training step (a
LightningModule with manual optimisation, davda54/sam used by hand) climbs to
``w + rho * g / |g|`` in place, clears, and takes its second backward there.  Such a
move shows in the parameters' version counters (``Tensor._version``, bumped by every
in-place write; relied on in ``tests/unit/test_grad_print.py``) of a few parameters of
each optimizer that stepped, read at every backward and at a clear after one.  The
same move tells `producers.iterations` that such a clear does not end the iteration.
"""

from __future__ import annotations

import math
import weakref
from typing import Any, Callable, Iterable

import torch

from .param_snapshots import tensor_norms

#: parameters per optimizer whose version counters stand for its weights
WEIGHT_SAMPLE = 8
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


def holds_unused_grads(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer holds finite gradients that are not all zero (one norm
    kernel per dtype and device, read back at once: only reached when a clear follows an
    unused backward)."""
    grads = [p.grad for group in optimizer.param_groups for p in group.get("params", ())
             if isinstance(p, torch.Tensor) and p.grad is not None and not p.grad.is_sparse]
    norms = [norm for norm in tensor_norms(grads) if norm is not None]
    return bool(norms) and all(math.isfinite(norm) for norm in norms) and any(norm > 0 for norm in norms)


def _key(optimizer: torch.optim.Optimizer) -> int:
    """An optimizer and its wrappers (Lightning's, accelerate's) share one ``param_groups``
    list: the step may be the inner optimizer's while the clear is the wrapper's."""
    return id(optimizer.param_groups)


class WastedGrads:
    """Whether a backward ran since the last optimizer step or clear whose gradients
    nothing used yet, and whether the program inspected them or took input gradients
    since."""

    def __init__(self) -> None:
        self._unused_backward = False
        self._excused = False  # inspected (clip) or input gradients since the last step
        self._graph_kept = False  # the latest backward retained its graph for another objective
        self._wipes = 0  # clears that discarded gradients since the last optimizer step
        self._wiped_before = False  # and between the two steps before
        # a few parameters of each optimizer that stepped, and their versions at the latest backward
        self._samples: dict[int, tuple[int, list[weakref.ref[torch.Tensor]]]] = {}  # _key -> (groups, sample)
        self._versions_at_backward: list[int] | None = None

    def backward_ran(self, keeps_graph: bool = False) -> None:
        self._unused_backward = True
        self._graph_kept = keeps_graph
        self._versions_at_backward = self._sample_versions() if self._samples else None

    def optimizer_stepped(self) -> None:
        self._unused_backward = False
        self._excused = False
        self._wiped_before, self._wipes = self._wipes > 0, 0
        self._versions_at_backward = None

    def step_ended(self, optimizer: torch.optim.Optimizer) -> None:
        """After an optimizer's step: the parameters whose versions stand for its weights."""
        groups = len(optimizer.param_groups)
        known = self._samples.get(_key(optimizer))
        if known is not None and known[0] == groups and all(ref() is not None for ref in known[1]):
            return  # the same optimizer (a dead one's list id, reused, has dead parameters)
        params = [p for group in optimizer.param_groups for p in group.get("params", ()) if isinstance(p, torch.Tensor)]
        count = min(WEIGHT_SAMPLE, len(params))
        self._samples = {key: kept for key, kept in self._samples.items() if all(ref() is not None for ref in kept[1])}
        self._samples[_key(optimizer)] = (groups, [weakref.ref(params[i * len(params) // count]) for i in range(count)])

    def _sample_versions(self) -> list[int]:
        return [param._version for _, sample in self._samples.values() for ref in sample
                if (param := ref()) is not None]

    def weights_moved(self) -> bool:
        """Whether the program wrote in place into weights of optimizers that stepped
        since the latest backward, with no step since (SAM's climb to the perturbed
        weights): the clear that follows discards gradients that were used."""
        return self._versions_at_backward is not None and self._sample_versions() != self._versions_at_backward

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
        if self._graph_kept:  # copied before the next objective's backward
            self._unused_backward = self._excused = False
            return None
        try:
            if self._excused or not any(holds_unused_grads(optimizer) for optimizer in optimizers):
                return None if self._excused else True
            if self.weights_moved():
                return None  # the gradients moved the weights before the clear (SAM's climb)
            self._wipes += 1
            return False if self._wipes > 1 or self._wiped_before else None  # one may be a skipped step
        finally:  # what the backward left is gone now
            self._unused_backward = self._excused = False
