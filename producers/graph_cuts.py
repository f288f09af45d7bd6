"""Layers that ran with gradients yet got none: the graph was cut between them and the loss.

A ``.detach()`` left on the features a head consumes (or a round trip through
``.item()``/numpy) stops every gradient into the layers before it.  The optimizer
still holds their parameters and skips them quietly (their ``grad`` stays None), the
head keeps learning, and the loss still falls.  A deliberate freeze looks different: its
layers run under ``torch.no_grad`` or with ``requires_grad=False``, so they never count
here.  What counts is judged at each optimizer step (after its closure, if any): of
the trainable parameters it holds whose modules ran with gradients since the previous
step and that had a gradient at one of its earlier steps, those without a gradient now
must not be the larger part by size.  A part that never had one is in a phase of its
own: an actor that only samples actions while its critic warms up, a generator's
pretraining before the discriminator's loss is switched on; a cut present from the
first step is not seen.  A small unused
piece that ran anyway (a pretrained pooler the program's own head ignores, an auxiliary
classifier whose output is dropped) stays well under half; a cut-off backbone does not.

Per forward this costs one set insertion; per step one ``grad is None`` test per
parameter, and the walk over the modules only when some gradient is missing.
"""

from __future__ import annotations

import weakref
from typing import Callable, Iterable

import torch

#: A loop without optimizer steps (hand-written updates) never empties the set; one that
#: also builds modules as it goes would grow it for ever, so past this size it starts over
#: (at worst one step is judged on fewer modules: more leniently).
MAX_REMEMBERED = 65_536


class GraphCuts:
    """The modules run with gradients since the last optimizer step, and which of each
    optimizer's parameters have had a gradient at one of its steps."""

    def __init__(self) -> None:
        self._ran: set[int] = set()
        # None: every parameter it held had one at some step (the common case, kept without a set)
        self._had_grads: "weakref.WeakKeyDictionary[torch.optim.Optimizer, set[int] | None]" = \
            weakref.WeakKeyDictionary()

    def ran(self, module: torch.nn.Module) -> None:
        ran = self._ran
        if len(ran) >= MAX_REMEMBERED:
            ran.clear()
        ran.add(id(module))

    def reaches_what_ran(self, optimizer: torch.optim.Optimizer,
                         roots: Callable[[], Iterable[torch.nn.Module]]) -> bool:
        """False when most of what the optimizer trains and saw run got no gradient.
        The common case (every trainable parameter has a gradient) is one pass over them."""
        missing = [p for group in optimizer.param_groups for p in group.get("params", ())
                   if p.requires_grad and p.grad is None]
        if not missing:
            self._had_grads[optimizer] = None
            return True
        had_grads = self._had_grads.get(optimizer, set())
        if had_grads is not None:
            missing = [p for p in missing if id(p) in had_grads]
            had_grads.update(id(p) for group in optimizer.param_groups for p in group.get("params", ())
                             if p.grad is not None)
            self._had_grads[optimizer] = had_grads
            if not missing:
                return True
        ran = self._ran
        ran_params = {
            id(param) for root in roots() for module in root.modules() if id(module) in ran
            for param in module._parameters.values() if param is not None
        }
        trainable = (p for group in optimizer.param_groups for p in group.get("params", ()) if p.requires_grad)
        total = sum(p.numel() for p in trainable if id(p) in ran_params)
        lost = sum(p.numel() for p in missing if id(p) in ran_params)
        return 2 * lost <= total

    def stepped(self) -> None:
        self._ran.clear()
