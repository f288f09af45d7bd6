"""Trained weights set back to their values before training, while the optimizer keeps its state.

A "load the pretrained encoder" line left inside the epoch loop, a reset meant for a
new cross-validation fold that forgets the optimizer, a "restore" of the checkpoint
written before the first step: ``Module.load_state_dict`` puts weights back where
training started, and training goes on.  Nothing fails; the loss jumps once and looks
like a noisy epoch, while the optimizer's moments (or momentum) describe weights that
are no longer there.

What tells this apart from the healthy restores is decided with fingerprints (digests)
of each parameter taken when an optimizer first steps it, before the update:

* a parameter is *rewound* by a load only when it had moved away from its first-step
  fingerprint before the load and is back at it after (a frozen part, a parameter that
  never moved, a rollback to a later checkpoint, an EMA swap restoring the current
  weights: none is rewound);
* it is judged at the next step of an optimizer holding it: the contract breaks when
  that optimizer holds state for the parameter (Adam's moments, momentum).  A new
  optimizer (a new fold, a restart) has none, and ``Optimizer.load_state_dict`` since
  the load restores the state with the weights (an LR finder's reset), so neither
  breaks it.

Fingerprints stay where the parameter lives: no host synchronisation when they are
taken; comparing them at a load (which copies the whole state dict anyway) reads them.
"""

from __future__ import annotations

import weakref
from typing import Any, Iterable

import torch

from .digest import cpu_digest, device_digest_words, local_data, skip_reason

Fingerprint = Any  # a digest string on CPU; two int64 words on the parameter's device elsewhere


def fingerprint(param: torch.Tensor, *, on_device: bool | None = None) -> Fingerprint | None:
    """``on_device`` picks the form as `producers.digest.tensor_digest` does (None: by
    device; True: the device words, which is how that path is tested on CPU)."""
    data = local_data(param)
    if skip_reason(data) is not None or not data.numel():
        return None
    if not (data.device.type != "cpu" if on_device is None else on_device):
        return cpu_digest(data)
    return (data.dtype, tuple(data.shape), device_digest_words(data))


def same(first: Fingerprint, second: Fingerprint) -> bool:
    if isinstance(first, str) or isinstance(second, str):
        return first == second
    return first[:2] == second[:2] and bool(torch.equal(first[2], second[2]))


class WeightRewinds:
    """First-step fingerprints, parameters rewound by a load, and the judgement at a step.

    Parameters are keyed by ``id`` with a weak reference to check it (tensors compare
    element-wise, so they cannot be keys of weak dictionaries); an id reused by a new
    tensor is a new parameter."""

    def __init__(self) -> None:
        self._initial: dict[int, tuple[weakref.ref[torch.Tensor], Fingerprint]] = {}
        self._rewound: dict[int, weakref.ref[torch.Tensor]] = {}

    def first_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Before an optimizer's first update: fingerprint the parameters no optimizer stepped yet."""
        for param in _params(optimizer):
            if self._initial_of(param) is None:
                taken = fingerprint(param)
                if taken is not None:
                    self._initial[id(param)] = (weakref.ref(param), taken)

    def _initial_of(self, param: torch.Tensor) -> Fingerprint | None:
        entry = self._initial.get(id(param))
        return entry[1] if entry is not None and entry[0]() is param else None

    def _is_rewound(self, param: torch.Tensor) -> bool:
        ref = self._rewound.get(id(param))
        return ref is not None and ref() is param

    def before_load(self, module: torch.nn.Module) -> list[tuple[torch.Tensor, bool]]:
        """The module's fingerprinted parameters, each with whether it had moved from its first step."""
        if not self._initial:
            return []
        moved = []
        for param in module.parameters():
            initial = self._initial_of(param)
            if initial is not None:
                now = fingerprint(param)
                moved.append((param, now is not None and not same(now, initial)))
        return moved

    def after_load(self, before: list[tuple[torch.Tensor, bool]]) -> None:
        for param, had_moved in before:
            now = fingerprint(param) if had_moved else None
            initial = self._initial_of(param)
            if now is not None and initial is not None and same(now, initial):
                self._rewound[id(param)] = weakref.ref(param)

    def state_restored(self, optimizer: torch.optim.Optimizer) -> None:
        """``Optimizer.load_state_dict``: its state now goes with whatever weights were restored."""
        for param in _params(optimizer):
            self._rewound.pop(id(param), None)

    def keeps_trained_weights(self, optimizer: torch.optim.Optimizer) -> bool:
        """False at the first step of ``optimizer`` after a load rewound a parameter it holds state for."""
        if not self._rewound:
            return True
        kept = True
        for param in _params(optimizer):
            if self._is_rewound(param):
                del self._rewound[id(param)]
                if optimizer.state.get(param):
                    kept = False
        return kept


def _params(optimizer: torch.optim.Optimizer) -> Iterable[torch.Tensor]:
    for group in optimizer.param_groups:
        yield from group.get("params", ())
