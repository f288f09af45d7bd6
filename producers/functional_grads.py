"""Training iterations of loops that take their gradients from ``torch.func``.

A loop that computes gradients with ``torch.func.grad`` or ``grad_and_value`` (per-sample
gradients under ``vmap`` for DP-SGD, functional meta-learning, model ensembles) and
updates the parameters by hand never calls ``Tensor.backward`` and often has no
optimizer, so the iteration tracker (`producers.iterations`) would see no training at
all and the whole run would be one unchecked window.  The functions these transforms
return are wrapped: a call that returned is the iteration's backward for the tracker,
once the next training forward (or the session's end) finds no optimizer known.  With an
optimizer, its steps end the iterations: such loops hand the gradients to ``p.grad``
after a ``zero_grad``, which a backward before it would turn into an iteration's end.
No event is recorded for it (the rules about backward calls are about
``Tensor.backward``, and a step's ``backprop`` still says whether one ever ran), and a
model run through ``functional_call`` inside the transform starts an iteration like any
root forward in training mode.  A program that imported the transforms before
the producer was installed keeps the originals and is not seen.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable

import torch

from .patching import PatchHandle, patch_attribute

if TYPE_CHECKING:
    from .tracer import Tracer

#: the ``torch.func`` transforms whose returned functions compute gradients
GRADIENT_TRANSFORMS = ("grad", "grad_and_value")


class PendingGradients:
    """Whether a gradient transform returned since the last training forward."""

    def __init__(self) -> None:
        self.pending = False

    def take(self) -> bool:
        pending, self.pending = self.pending, False
        return pending


def patch_functional_grads(tracer: "Tracer") -> list[PatchHandle]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def transform(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
            transformed = original(func, *args, **kwargs)

            @functools.wraps(transformed)
            def computing_gradients(*call_args: Any, **call_kwargs: Any) -> Any:
                result = transformed(*call_args, **call_kwargs)
                if tracer.enabled and not tracer.busy and not tracer.in_optimizer_step:
                    tracer.functional_gradients.pending = True
                return result

            return computing_gradients

        return transform

    return [patch_attribute(torch.func, name, make) for name in GRADIENT_TRANSFORMS if hasattr(torch.func, name)]
