"""Which tensors are probabilities: the outputs of softmax and sigmoid, marked as made.

A loss that normalises its input itself (``cross_entropy``, ``nll_loss`` expecting
log-probabilities, ``binary_cross_entropy_with_logits``) trains slowly and silently
when it is given probabilities: the classic double softmax, or a sigmoid left in
front of ``BCEWithLogitsLoss``.  The tensor that reaches the loss keeps no trace of
how it was made, so the outputs of the normalising functions are remembered as they
return (by identity, held weakly), and the summary of a recorded call's tensor
argument says ``probs: True`` when it is one of them, unchanged since: an in-place
edit (``probs.clamp_(min=eps).log_()`` before ``nll_loss``) moves the tensor's version
counter and makes it something else.  Marking costs one dictionary insert per softmax
or sigmoid; none of these calls is recorded as an event.  Inside
``torch.compile``'d regions nothing is marked (as nothing is recorded there).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch

from .patching import PatchHandle, patch_attribute

#: (owner, attribute) of every public spelling of softmax and sigmoid; nn.Softmax and
#: nn.Sigmoid call the functional forms
NORMALISERS: tuple[tuple[Any, str], ...] = (
    (torch.nn.functional, "softmax"),
    (torch, "softmax"),
    (torch.Tensor, "softmax"),
    (torch.special, "softmax"),
    (torch.nn.functional, "sigmoid"),
    (torch, "sigmoid"),
    (torch.Tensor, "sigmoid"),
    (torch.special, "expit"),
)

#: id -> (weak reference, version counter when made)
_marked: dict[int, tuple["weakref.ref[torch.Tensor]", int]] = {}


def is_probabilities(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is the very output of a softmax or sigmoid, not edited in place since."""
    mark = _marked.get(id(tensor))
    return mark is not None and mark[0]() is tensor and tensor._version == mark[1]


def _mark(tensor: Any) -> None:
    if not isinstance(tensor, torch.Tensor):
        return
    key = id(tensor)
    try:
        _marked[key] = (weakref.ref(tensor, lambda _dead, key=key: _marked.pop(key, None)), tensor._version)
    except (TypeError, RuntimeError):  # no weak references or version counter (some subclasses): unmarked
        pass


def _marking(is_compiling: Callable[[], bool]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def marked(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            if not is_compiling():
                _mark(result)
            return result

        return marked

    return make


def install_probability_marks(is_compiling: Callable[[], bool]) -> list[PatchHandle]:
    """Wrap every spelling of softmax and sigmoid so that their outputs are known."""
    make = _marking(is_compiling)
    return [patch_attribute(owner, attr, make) for owner, attr in NORMALISERS if hasattr(owner, attr)]
