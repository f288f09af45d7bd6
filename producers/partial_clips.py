"""Clips that rescale a partial sum of an accumulation cycle.

With gradient accumulation, ``clip_grad_norm_`` belongs after the cycle's last backward:
it bounds the gradients the step applies.  Called after every micro-batch (accelerate's
``accelerator.clip_grad_norm_`` outside ``if accelerator.sync_gradients``, accelerate#641,
diffusers PR 721), a clip whose partial sum exceeds the bound rescales it, and the
micro-batches after it are added at full weight: the update is no longer the clipped
average, and it is weighted toward the cycle's last micro-batches.  Nothing differs
while the partial norms stay under the bound.

So each optimizer step after a clip carries ``clips_whole_cycles``: no clip since the
previous step rescaled gradients of this optimizer's parameters that a later backward
then added to (a gradient is another tensor, or was written in place, after the clip).
Only clips that rescaled are remembered, with their gradients' identities and version
counters; a clear drops them (a step skipped on overflow), and norms on an accelerator
are not read (the clip's result would block the step), so those clips are not judged.
"""

from __future__ import annotations

import math
from typing import Any

import torch


class PartialClips:
    """Since the previous optimizer step: whether a clip ran, and the gradients of the
    clips that rescaled, as they were right after the clip."""

    def __init__(self) -> None:
        self._clipped = False
        self._rescaled: dict[int, tuple[int, int]] = {}  # id(param) -> (id(grad), grad._version)
        self._added_to = False  # a backward added to gradients a clip had rescaled

    def clip_returned(self, tensors: list[torch.Tensor], bound: float, total_norm: Any) -> None:
        """A ``clip_grad_norm_`` over ``tensors`` with ``bound`` returned ``total_norm``."""
        self._clipped = True
        self._added_to = self._added_to or _added_to(self._rescaled, tensors)
        if isinstance(total_norm, torch.Tensor):
            if total_norm.numel() != 1 or total_norm.device.type != "cpu":
                return
            total_norm = total_norm.item()
        if not isinstance(total_norm, (int, float)) or not math.isfinite(total_norm) or total_norm + 1e-6 <= bound:
            return
        for param in tensors:
            grad = param.grad
            if grad is not None:
                self._rescaled[id(param)] = (id(grad), grad._version)

    def cleared(self) -> None:
        self._rescaled.clear()
        self._added_to = False

    def clips_whole_cycles(self, optimizer: torch.optim.Optimizer) -> bool | None:
        """Judged before a step of ``optimizer`` (None: no clip since the previous step)."""
        clipped, rescaled, added_to = self._clipped, self._rescaled, self._added_to
        self._clipped, self._rescaled, self._added_to = False, {}, False
        if not clipped:
            return None
        held = [param for group in optimizer.param_groups for param in group.get("params", ())]
        return not (added_to or _added_to(rescaled, held))


def _added_to(rescaled: dict[int, tuple[int, int]], tensors: list[torch.Tensor]) -> bool:
    """Whether a gradient of ``tensors`` that a clip rescaled changed since (another
    tensor, or written in place: a backward accumulated into it)."""
    if not rescaled:
        return False
    for param in tensors:
        before = rescaled.get(id(param))
        grad = getattr(param, "grad", None)
        if before is not None and grad is not None and before != (id(grad), grad._version):
            return True
    return False
