"""Weights re-initialised after a resume loaded them.

A resumed job loads the model's weights and the optimizer's state.  A framework that
runs its weight initialisation unconditionally after the load (picotron#32:
``init_model_parameters()`` after ``load_state_dict(..., assign=True)``;
prime-rl#1096) throws the loaded weights away while the optimizer goes on with moments
built for them, the step counter and schedule resumed: the loss jumps back to where
training began and nothing fails.

So an optimizer's first step after a resume (``Optimizer.load_state_dict`` gave it
per-parameter state, which only steps create) carries ``resumes_loaded_weights``: no
parameter it has state for was re-initialised (``torch.nn.init.*``) since a
``Module.load_state_dict`` gave it its values.  It is judged once per resume; steps
without a resume are not judged.  Initialising before the load (a model built, then
restored), a new head initialised over a loaded checkpoint by a run whose optimizer
starts afresh, and parameters no load ever reached are fine or not judged.
"""

from __future__ import annotations

import weakref
from typing import Iterable

import torch
from torch.utils.weak import WeakIdKeyDictionary


class ResumedWeights:
    """Parameters initialised since their latest load, and optimizers resumed since their
    latest step."""

    def __init__(self) -> None:
        self._loaded: WeakIdKeyDictionary[torch.Tensor, bool] = WeakIdKeyDictionary()
        self._reset: WeakIdKeyDictionary[torch.Tensor, bool] = WeakIdKeyDictionary()
        self._resumed: "weakref.WeakSet[torch.optim.Optimizer]" = weakref.WeakSet()

    def loaded(self, params: Iterable[torch.Tensor]) -> None:
        """A load gave these parameters their values (placeholders on the meta device
        included: a resumed job may build its model without memory and load into it)."""
        for param in params:
            self._reset.pop(param, None)
            self._loaded[param] = True

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
