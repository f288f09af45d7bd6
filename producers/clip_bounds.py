"""Steps that apply gradients above the bound a clip right before them asked for.

``clip_grad_norm_(parameters, max_norm)`` bounds the norm of the gradients the next
optimizer step applies, provided nothing changes them in between and the clip is given
the parameters.  Python makes the second easy to lose: ``model.parameters()`` and
``filter(lambda p: p.requires_grad, ...)`` are one-shot iterators, and one already
consumed by the optimizer's constructor hands the clip nothing to clip (PixArt-alpha
PR 160; torch warns only for an empty generator, not for an exhausted ``filter``).  No
error, no NaN: the run trains unclipped, and only the batches whose gradients exceed the
bound show it.

So each optimizer step carries ``steps_clipped_grads``: when a ``clip_grad_norm_`` ran
after the latest backward, the gradients the step applies are within its bound — the
gradients of the tensors the clip was given, or, where it was given none, of the
parameters the optimizer holds.  A clip before a later backward bounds nothing that step
applies (accumulation that clips each micro-batch) and is not judged; steps without a
clip, gradients on an accelerator (reading their norm would block the step), norms that
are not finite and other norm types than the usual ones are not judged either.

One-shot iterators are read once here and handed to ``clip_grad_norm_`` as a list (a
generator as a new generator, so torch's empty-generator warning still fires).
"""

from __future__ import annotations

import math
import types
from typing import Any

import torch

from .ownership import held_parameters

#: relative slack over the bound: the clip scales by max_norm / (norm + 1e-6), and in a
#: low-precision gradient dtype each scaled element rounds (bf16: about 0.4 % per element)
TOLERANCE = 1e-3
ROUNDING_EPSILONS = 4


class ClipBounds:
    """The clips run since the latest backward: the tensors each was given and its bound."""

    def __init__(self) -> None:
        self._clips: list[tuple[list[torch.Tensor], float, float]] = []
        #: the tensors and bound of the clip being called, once it could be read
        self.calling: tuple[list[torch.Tensor], float] | None = None

    def clip_called(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Note a ``clip_grad_norm_`` call; returns the arguments to call it with (a one-shot
        iterator of parameters, read here, is passed on as an equivalent one)."""
        self.calling = None
        in_kwargs = "parameters" in kwargs
        parameters = kwargs["parameters"] if in_kwargs else (args[0] if args else None)
        if parameters is None:
            return args, kwargs
        if isinstance(parameters, torch.Tensor):
            tensors = [parameters]
        elif isinstance(parameters, (list, tuple)):
            tensors = list(parameters)  # read again by the clip as it is
        else:
            tensors = list(parameters)
            handed = (p for p in tensors) if isinstance(parameters, types.GeneratorType) else tensors
            if in_kwargs:
                kwargs = {**kwargs, "parameters": handed}
            else:
                args = (handed, *args[1:])
        bound = kwargs.get("max_norm", args[1] if len(args) > 1 else None)
        norm_type = kwargs.get("norm_type", args[2] if len(args) > 2 else 2.0)
        if isinstance(bound, (int, float)) and isinstance(norm_type, (int, float)) and 0 < bound < math.inf:
            clipped = [t for t in tensors if isinstance(t, torch.Tensor)]
            self._clips.append((clipped, float(bound), float(norm_type)))
            self.calling = (clipped, float(bound))
        return args, kwargs

    def backward_ran(self) -> None:
        self._clips.clear()

    def steps_clipped_grads(self, optimizer: torch.optim.Optimizer) -> bool | None:
        """Judged before a step of ``optimizer`` (None: no clip since the latest backward, or
        not judged); the clips are used up."""
        clips, self._clips = self._clips, []
        verdicts = [_within(tensors or held_parameters(optimizer), bound, norm_type) for tensors, bound, norm_type in clips]
        if False in verdicts:
            return False
        return True if True in verdicts else None


def _within(tensors: list[torch.Tensor], bound: float, norm_type: float) -> bool | None:
    grads = [t.grad for t in tensors if t.grad is not None]
    if not grads or norm_type not in (1.0, 2.0, math.inf):
        return None
    for grad in grads:
        if not grad.is_cpu or grad.is_sparse:
            return None
    dtypes = {grad.dtype for grad in grads}
    with torch.no_grad():
        # one fused pass; `get_total_norm` would first group the tensors by device and dtype
        norms = torch._foreach_norm(grads, norm_type)
        if len(dtypes) > 1:
            norms = [norm.float() for norm in norms]
        total = float(torch.linalg.vector_norm(torch.stack(norms), norm_type))
    if not math.isfinite(total):
        return None
    return total <= bound * (1 + _slack(dtypes)) + 1e-6


def _slack(dtypes: set[torch.dtype]) -> float:
    return max(TOLERANCE, ROUNDING_EPSILONS * max(_EPSILONS.get(dtype) or _epsilon(dtype) for dtype in dtypes))


_EPSILONS: dict[torch.dtype, float] = {}


def _epsilon(dtype: torch.dtype) -> float:
    return _EPSILONS.setdefault(dtype, torch.finfo(dtype).eps)
