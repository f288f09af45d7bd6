"""Whether gradients are still multiplied by a ``GradScaler``'s loss scale.

With mixed precision the loss is scaled (by 65,536 to start with) before ``backward``,
so every gradient is that much too large until ``GradScaler.unscale_`` divides it back
(``GradScaler.step`` does so itself if nobody did).  ``clip_grad_norm_`` on scaled
gradients sees a norm tens of thousands of times too large and clips every update to a
sliver, silently: the documented recipe is ``scaler.unscale_(optimizer)`` first.  torch
keeps no public record of whether the gradients are scaled, so the three scaler methods
that change it are wrapped (removably) and a clip reads the answer.  A disabled scaler
(``enabled=False``) scales nothing.  One flag per process is enough for the contract:
any ``unscale_`` since the last ``scale`` counts, so a program with two optimizers is
never accused, at worst a clip of the second optimizer's gradients is not judged.
The scaled loss itself is handed on (``on_scaled``): its multiplication is the scaler's,
not a rescaling the program wrote (`producers.loss_averaging`).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .patching import PatchHandle, patch_attribute


class LossScaleTracker:
    """Knows whether a ``scale`` happened since the last ``unscale_`` or ``update``, and
    how many ``update`` calls there were (one per attempted step, skipped or not)."""

    def __init__(self) -> None:
        self.scaled = False
        self.updates = 0
        self._on_scaled: Callable[[Any], None] = lambda output: None

    def install(self, on_scaled: Callable[[Any], None]) -> list[PatchHandle]:
        scaler = getattr(getattr(torch, "amp", None), "GradScaler", None)
        if scaler is None:
            return []
        self._on_scaled = on_scaled
        return [
            patch_attribute(scaler, "scale", self._after(self._scaled)),
            patch_attribute(scaler, "unscale_", self._after(self._unscaled)),
            patch_attribute(scaler, "update", self._after(self._updated)),
        ]

    def _scaled(self, scaler: Any, output: Any) -> None:
        if scaler.is_enabled():
            self.scaled = True
            self._on_scaled(output)

    def _unscaled(self, scaler: Any, result: Any) -> None:
        self.scaled = False

    def _updated(self, scaler: Any, result: Any) -> None:
        self.scaled = False
        self.updates += 1

    @staticmethod
    def _after(note: Callable[[Any, Any], None]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def noted(scaler: Any, *args: Any, **kwargs: Any) -> Any:
                result = original(scaler, *args, **kwargs)
                note(scaler, result)
                return result

            return noted

        return make
