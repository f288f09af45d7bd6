"""Parameters unfrozen after training began that no optimizer holds.

Optimizers built over "the trainable parameters" (Hugging Face ``Trainer``'s
``create_optimizer``, a ``filter(lambda p: p.requires_grad, ...)`` in the loop) hold
only what was trainable when they were built.  A gradual-unfreezing callback that later
sets ``requires_grad=True`` makes those layers take gradients, which show up in every
gradient norm, yet nothing ever updates them.  The healthy ways to unfreeze put the
parameters in an optimizer: one built over every parameter from the start,
``add_param_group`` (Lightning's ``BaseFinetuning.unfreeze_and_add_param_group``), or a
new optimizer.

So the parameters of each model that are frozen when an optimizer step first sees the
model are watched.  The first time some of them have a gradient at an optimizer step,
they are judged once, together: most of them by size must be held by a live optimizer.
(Lightning's ``unfreeze_and_add_param_group(..., train_bn=False)`` makes a block's
BatchNorm weights take gradients that no optimizer holds, on purpose; they are a sliver
of the block it adds.)  A GAN's discriminator frozen during
the generator's update, a momentum teacher that never takes gradients, a backbone left
trainable but outside a head-only optimizer from the start: none breaks the contract.
"""

from __future__ import annotations

import weakref
from typing import Callable, Iterable

import torch


class UnfrozenParams:
    """Watches each model's initially frozen parameters until one takes a gradient."""

    def __init__(self) -> None:
        self._models_seen: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()
        self._watched: dict[int, weakref.ref[torch.Tensor]] = {}

    def optimizes_unfrozen(self, models: Iterable[torch.nn.Module],
                           live_optimizers: Callable[[], list[tuple[str, list[torch.Tensor]]]]) -> bool:
        """False at an optimizer step where the parameters frozen when their model was
        first seen that have a gradient for the first time are mostly (by size) held by
        no optimizer."""
        for model in models:
            if model not in self._models_seen:
                self._models_seen.add(model)
                for param in model.parameters():
                    if not param.requires_grad and param.is_floating_point():
                        self._watched[id(param)] = weakref.ref(param)
        if not self._watched:
            return True
        given: list[torch.Tensor] = []
        for key, ref in list(self._watched.items()):
            param = ref()
            if param is None or (param.requires_grad and param.grad is not None):
                del self._watched[key]
                if param is not None:
                    given.append(param)
        if not given:
            return True
        held = {id(param) for _, params in live_optimizers() for param in params}
        total = sum(param.numel() for param in given)
        lost = sum(param.numel() for param in given if id(param) not in held)
        return 2 * lost <= total
