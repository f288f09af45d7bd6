"""Parameters frozen before a checkpoint that train after the resume.

``requires_grad`` is no part of a ``state_dict``.  A resume that rebuilds the model
(``from_pretrained``, a fresh constructor) and loads the weights and the optimizer
state, but forgets the ``freeze_feature_encoder()`` or ``requires_grad_(False)`` the
first run applied after building it, trains what was frozen (transformers#11294,
composer#1002): the optimizer was built over every parameter, the frozen ones never got
a gradient and so hold no state, and from the resume on they are updated with fresh
moments while the rest goes on.  Nothing fails; the frozen encoder drifts.

So an optimizer's first step after ``Optimizer.load_state_dict`` gave it per-parameter
state carries ``resumes_trained_parameters``: every parameter it steps (one with a
gradient) has state from the checkpoint, or was frozen when the state was loaded and
unfrozen since (a schedule that unfreezes at the epoch the run resumes in).  Judged once
per resume; an optimizer whose checkpoint held no state (plain SGD, a resume before any
step) is not judged.
"""

from __future__ import annotations

import torch
from torch.utils.weak import WeakIdKeyDictionary

from .ownership import held_parameters


class ResumedFreezes:
    """Optimizers resumed since their latest step, and the parameters frozen when they were."""

    def __init__(self) -> None:
        self._frozen_at_resume: WeakIdKeyDictionary[torch.optim.Optimizer, set[int]] = WeakIdKeyDictionary()

    def optimizer_loaded(self, optimizer: torch.optim.Optimizer) -> None:
        if any(optimizer.state.values()):
            self._frozen_at_resume[optimizer] = {id(param) for param in held_parameters(optimizer) if not param.requires_grad}

    def resumes_trained_parameters(self, optimizer: torch.optim.Optimizer) -> bool | None:
        """Judged before a step of ``optimizer`` (None: no resume since its previous step)."""
        frozen = self._frozen_at_resume.pop(optimizer, None)
        if frozen is None:
            return None
        state = optimizer.state
        return not any(param.grad is not None and not state.get(param) and id(param) not in frozen
                       for param in held_parameters(optimizer))

