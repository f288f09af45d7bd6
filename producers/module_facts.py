"""Facts about a module instance that only its first forward in this process can tell.

Some modules are only correct if their first forward runs in a particular mode: the
legacy ``torch.nn.utils.spectral_norm`` starts from random singular-vector estimates
and refines them by power iteration only in training-mode forwards, so a first
forward in ``eval()`` divides the weight by a sigma estimated from random vectors
(PyTorch issue 51800).  Nothing in one eval forward looks wrong by itself; what is
wrong is that it came *first*.  So the module-forward ``pre`` event of a module's
first forward carries, in its ``ctx``:

``first_forward``  ``True`` (absent on every later forward, so steady-state events
                   do not grow)
``spectral_norm``  ``"hook"`` for the legacy forward-pre-hook implementation,
                   ``"parametrization"`` for ``torch.nn.utils.parametrizations``
                   (which already runs 15 power iterations when registered), absent
                   when the module has no spectral normalisation
``spectral_norm_refined``  (``"hook"`` only) whether the stored singular-vector
                   estimate already fits the weight.  A first forward in eval mode is
                   harmless when ``u``/``v`` came from a checkpoint (a resumed run that
                   validates before it trains): after a power iteration ``u`` is
                   ``W v`` normalised, so ``u^T W v`` is close to ``|W v|`` and
                   ``|W^T u|``, while for the random vectors of a fresh layer it is
                   about ``1/sqrt(rows)`` of them.  Computed once per module, on its
                   device, with two matrix-vector products.

The first-forward bookkeeping is a dict lookup by ``id`` per forward; entries leave
with their module (a weak reference's callback), so a new module that reuses a dead
one's id counts as new.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.nn.utils import parametrize
from torch.nn.utils.spectral_norm import SpectralNorm

#: the parametrization class behind ``torch.nn.utils.parametrizations.spectral_norm``
#: (private in torch, so looked up rather than imported; None if it ever moves)
_SPECTRAL_PARAMETRIZATION: type | None = getattr(torch.nn.utils.parametrizations, "_SpectralNorm", None)


class FirstForwards:
    """Which module instances have already run a forward in this process."""

    def __init__(self) -> None:
        self._seen: dict[int, weakref.ref[torch.nn.Module]] = {}

    def is_first(self, module: torch.nn.Module) -> bool:
        """True exactly once per live module instance: on the call that first asks."""
        key = id(module)
        if key in self._seen:
            return False
        seen = self._seen
        seen[key] = weakref.ref(module, lambda _ref, key=key: seen.pop(key, None))
        return True

    def __len__(self) -> int:
        return len(self._seen)


class ParameterFree:
    """Which module instances hold no parameter, themselves or below: modules that can
    only transform samples (normalise, pad, augment), never learn to regroup them
    (pool nodes into graphs, merge time into the batch).  Each instance is looked at
    once; the answer is kept while it lives."""

    def __init__(self) -> None:
        self._known: dict[int, tuple[weakref.ref[torch.nn.Module], bool]] = {}

    def __call__(self, module: torch.nn.Module) -> bool:
        key = id(module)
        entry = self._known.get(key)
        if entry is not None and entry[0]() is module:
            return entry[1]
        free = next(iter(module.parameters()), None) is None
        known = self._known
        try:
            known[key] = (weakref.ref(module, lambda _ref, key=key: known.pop(key, None)), free)
        except TypeError:  # a module type without weak references: asked again next time
            pass
        return free


def spectral_norm_kind(module: torch.nn.Module) -> str | None:
    """``"hook"`` / ``"parametrization"`` when the module's weight is spectrally normalised."""
    for hook in module._forward_pre_hooks.values():
        if isinstance(hook, SpectralNorm):
            return "hook"
    if _SPECTRAL_PARAMETRIZATION is not None and parametrize.is_parametrized(module):
        for parametrizations in module.parametrizations.values():
            if any(isinstance(p, _SPECTRAL_PARAMETRIZATION) for p in parametrizations):
                return "parametrization"
    return None


#: ``u^T W v / max(|W v|, |W^T u|)`` from which an estimate counts as refined.  Tried on
#: Linear layers 32x32 to 256x256, 1x16, 16x1 and 128x2 (50 seeds each): one power
#: iteration gives 0.84 or more, three give 0.96 or more, fresh random vectors at most
#: 0.56 (single-row weights; about 1/sqrt(rows) otherwise).
REFINED_ALIGNMENT = 0.75


def spectral_estimate_refined(module: torch.nn.Module) -> bool | None:
    """Whether a hook-based spectral norm's ``u``/``v`` fit its weight; None if unknown."""
    for hook in module._forward_pre_hooks.values():
        if not isinstance(hook, SpectralNorm):
            continue
        try:
            with torch.no_grad():
                weight = getattr(module, hook.name + "_orig")
                matrix = hook.reshape_weight_to_matrix(weight).float()
                u = getattr(module, hook.name + "_u").float()
                v = getattr(module, hook.name + "_v").float()
                weight_v = torch.mv(matrix, v)
                scale = torch.maximum(weight_v.norm(), torch.mv(matrix.t(), u).norm())
                alignment = (torch.dot(u, weight_v) / scale).item() if scale.item() > 0 else None
        except (AttributeError, RuntimeError, ValueError):  # meta/fake tensors, odd subclasses
            return None
        return None if alignment is None or alignment != alignment else alignment >= REFINED_ALIGNMENT
    return None


def first_forward_context(module: torch.nn.Module) -> dict[str, Any]:
    """The ``ctx`` entries of a module's first forward (see the module docstring)."""
    facts: dict[str, Any] = {"first_forward": True}
    kind = spectral_norm_kind(module)
    if kind is not None:
        facts["spectral_norm"] = kind
    if kind == "hook":
        refined = spectral_estimate_refined(module)
        if refined is not None:
            facts["spectral_norm_refined"] = refined
    return facts
