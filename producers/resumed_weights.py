"""Weights re-initialised after a resume loaded them.

A resumed job loads the model's weights and the optimizer's state.  A framework that
runs its weight initialisation unconditionally after the load (picotron#32:
``init_model_parameters()`` after ``load_state_dict(..., assign=True)``;
prime-rl#1096) throws the loaded weights away while the optimizer goes on with moments
built for them, the step counter and schedule resumed: the loss jumps back to where
training began and nothing fails.

A data-dependent initialisation does the same from inside the model: an ActNorm layer
whose "initialised" flag is a plain attribute, not a buffer, is not initialised after a
reload as far as it knows, and its first training forward overwrites the loaded scale
and shift with statistics of the current batch (nflows#4).

So an optimizer's first step after a resume (``Optimizer.load_state_dict`` gave it
per-parameter state, which only steps create) carries ``resumes_loaded_weights``: no
parameter it has state for was re-initialised (``torch.nn.init.*``) since a
``Module.load_state_dict`` gave it its values, nor changed by the first training-mode
forward of the model it belongs to (fingerprints before and after that forward, taken
once per load; a program that restores other weights between the load and that forward,
an EMA callback putting the raw weights back, changes nothing inside the forward).  It is judged once per resume; steps
without a resume are not judged.  Initialising before the load (a model built, then
restored), a new head initialised over a loaded checkpoint by a run whose optimizer
starts afresh, and parameters no load ever reached are fine or not judged.
"""

from __future__ import annotations

import weakref
from typing import Iterable

import torch
from torch.utils.weak import WeakIdKeyDictionary

from .weight_rewinds import Fingerprint, fingerprint, same

#: training forwards after a load that may still be the loaded model's first (a loaded
#: teacher that never trains must not keep every later forward looking)
WATCHED_FORWARDS = 8


class ResumedWeights:
    """Parameters initialised since their latest load, and optimizers resumed since their
    latest step."""

    def __init__(self) -> None:
        self._loaded: WeakIdKeyDictionary[torch.Tensor, bool] = WeakIdKeyDictionary()
        self._reset: WeakIdKeyDictionary[torch.Tensor, bool] = WeakIdKeyDictionary()
        self._resumed: "weakref.WeakSet[torch.optim.Optimizer]" = weakref.WeakSet()
        self._unwatched: WeakIdKeyDictionary[torch.Tensor, bool] = WeakIdKeyDictionary()  # loaded, no forward yet
        self._forwards_left = 0
        self._watched: list[tuple[weakref.ref[torch.Tensor], Fingerprint]] = []

    def loaded(self, params: Iterable[torch.Tensor]) -> None:
        """A load gave these parameters their values (placeholders on the meta device
        included: a resumed job may build its model without memory and load into it)."""
        for param in params:
            self._reset.pop(param, None)
            self._loaded[param] = True
            self._unwatched[param] = True
        self._forwards_left = WATCHED_FORWARDS

    @property
    def looking(self) -> bool:
        """Whether a load's first forward is still to come or in progress (the forward hooks
        ask before anything else, on every root forward)."""
        return bool(self._unwatched) or bool(self._watched)

    def training_forward_began(self, model: torch.nn.Module) -> None:
        """A training-mode forward of ``model`` (a root) with gradients begins: its first
        since its parameters were loaded is watched."""
        if not self._unwatched:
            return
        self._forwards_left -= 1
        for param in model.parameters():
            if self._unwatched.pop(param, None):
                taken = fingerprint(param)
                if taken is not None:
                    self._watched.append((weakref.ref(param), taken))
        if self._forwards_left <= 0:
            self._unwatched = WeakIdKeyDictionary()

    def training_forward_ended(self) -> None:
        watched, self._watched = self._watched, []
        for ref, before in watched:
            param = ref()
            after = fingerprint(param) if param is not None else None
            if after is not None and _comparable(before, after) and not same(before, after):
                self._reset[param] = True

    def initialised(self, tensor: torch.Tensor) -> None:
        """An initialiser overwrote ``tensor``: noted if a load gave it its values."""
        if tensor in self._loaded:
            self._reset[tensor] = True

    def optimizer_loaded(self, optimizer: torch.optim.Optimizer) -> None:
        if any(optimizer.state.values()):
            self._resumed.add(optimizer)

    def resumes_loaded_weights(self, optimizer: torch.optim.Optimizer) -> bool | None:
        """Judged before a step of ``optimizer`` (None: no resume since its previous step)."""
        if optimizer not in self._resumed:
            return None
        self._resumed.discard(optimizer)
        return not any(param in self._reset for param in optimizer.state)


def _comparable(first: Fingerprint, second: Fingerprint) -> bool:
    """Two fingerprints of one form and, on a device, of one dtype and shape (a sharded
    parameter gathered for the forward is a layout change, not a write)."""
    if isinstance(first, str) or isinstance(second, str):
        return isinstance(first, str) and isinstance(second, str)
    return first[:2] == second[:2]
