"""Forwards that run on autocast's cached casts of weights an optimizer has since updated.

Autocast casts each float32 leaf parameter to the low precision once and keeps the
copy until the outermost autocast region exits (``torch.clear_autocast_cache``).  A
loop written as one long ``with torch.autocast(...)`` around forward, backward *and*
``optimizer.step()`` therefore updates the float32 weights in place while every later
forward keeps computing with the copies cast at the region's first forward: the model
the loss sees never changes, the loss flattens, nothing errors (Flow-Factory#186; the
AMP docs only say autocast "should wrap only the forward pass(es)").

The producer notes when an optimizer holding float32 parameters steps inside an autocast
region (torch's nesting level above zero, read with the public increment/decrement
pair) and forgets it when torch drops the cache.  A model's training forward (the root,
gradients on) that runs under an enabled autocast with its cache on, after such a step
and before the cache was dropped, ran on stale weights.  Each optimizer's next step
carries the answer as ``fresh_autocast_weights``.  Regions entered per iteration or per
forward (Lightning, Hugging Face ``Trainer``, accelerate), ``cache_enabled=False``,
low-precision weights and steps outside autocast are fine; forwards with no autocast
are not judged.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .patching import PatchHandle, patch_attribute


def autocast_nesting() -> int:
    """How many autocast regions (enabled or not) enclose this point; changes nothing."""
    level = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    return level


def _holds_float32(optimizer: torch.optim.Optimizer) -> bool:
    return any(param.dtype == torch.float32 for group in optimizer.param_groups for param in group.get("params", ()))


class AutocastCache:
    """Whether an optimizer stepped since autocast last dropped its cache, and the
    forwards that ran on the casts cached before that step."""

    def __init__(self) -> None:
        self._stepped_in_region = False
        self._forwards = 0  # training forwards under autocast with its cache on
        self._last_stale = -1  # the number of the latest of them that ran on stale casts
        self._seen_by: dict[int, int] = {}  # id(optimizer) -> such forwards at its previous step

    def dropped(self) -> None:
        """torch dropped the cache (the outermost region exited)."""
        self._stepped_in_region = False

    def training_forward(self, device_types: list[str]) -> None:
        """A model's training forward begins."""
        if not torch.is_autocast_cache_enabled() or not any(torch.is_autocast_enabled(d) for d in device_types):
            return
        if self._stepped_in_region:
            self._last_stale = self._forwards
        self._forwards += 1

    def fresh_autocast_weights(self, optimizer: torch.optim.Optimizer) -> bool | None:
        """Judged before the step runs; then notes whether the step runs inside a region
        (None: no training forward under autocast since this optimizer's previous step)."""
        previous = self._seen_by.get(id(optimizer), 0)
        self._seen_by[id(optimizer)] = self._forwards
        fresh = None if self._forwards == previous else self._last_stale < previous
        if not self._stepped_in_region and autocast_nesting() > 0 and _holds_float32(optimizer):
            self._stepped_in_region = True
        return fresh

    def install(self) -> PatchHandle:
        """Learn when torch drops the cache: ``autocast.__exit__`` calls
        ``torch.clear_autocast_cache()`` when the outermost region exits."""

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def clear(*args: Any, **kwargs: Any) -> Any:
                self.dropped()
                return original(*args, **kwargs)

            return clear

        return patch_attribute(torch, "clear_autocast_cache", make)
