"""Training passes over a ``DistributedSampler`` that shuffles: is each one a new epoch?

``DistributedSampler(shuffle=True)`` seeds its permutation with ``seed + epoch``, and
the epoch changes only when the program calls ``sampler.set_epoch(epoch)``; without it
every epoch replays the first epoch's order and batch composition on every rank
(PyTorch issue 31771), which no loss curve shows.  So each pass of a training loop over
such a loader (``DataLoader.__iter__`` with gradients enabled and the model in training
mode) is recorded with the contract ``reshuffles_each_epoch``: the sampler's epoch
differs from the one of its previous training pass.  Passes without gradients or with
the model in evaluation mode (accuracy on the training set at the end of an epoch) are
neither judged nor remembered; loaders whose sampler does not shuffle record nothing.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from invariants.events import DATALOADER_EPOCH

from .patching import PatchHandle, patch_attribute

if TYPE_CHECKING:
    from .tracer import Tracer


def _shuffling_sampler(loader: Any) -> DistributedSampler | None:
    batch_sampler = getattr(loader, "batch_sampler", None)
    for sampler in (getattr(loader, "sampler", None), getattr(batch_sampler, "sampler", None)):
        if isinstance(sampler, DistributedSampler) and getattr(sampler, "shuffle", False):
            return sampler
    return None


class SamplerEpochs:
    """The epoch each shuffling sampler's previous training pass started from."""

    def __init__(self) -> None:
        self._last: "weakref.WeakKeyDictionary[DistributedSampler, int]" = weakref.WeakKeyDictionary()

    def new_epoch(self, sampler: DistributedSampler) -> bool | None:
        """Whether a training pass starting now starts a new epoch; None if it cannot tell."""
        epoch = getattr(sampler, "epoch", None)
        if not isinstance(epoch, int):
            return None
        last = self._last.get(sampler)
        self._last[sampler] = epoch
        return last is None or last != epoch


def patch_dataloader_epochs(tracer: "Tracer") -> PatchHandle:
    epochs = SamplerEpochs()

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def iterate(loader: Any, *args: Any, **kwargs: Any) -> Any:
            if tracer.enabled and not tracer.busy:
                try:
                    _record_pass(tracer, epochs, loader)
                except Exception as exc:
                    tracer.internal_error("DataLoader pass", exc)
            return original(loader, *args, **kwargs)

        return iterate

    return patch_attribute(DataLoader, "__iter__", make)


def _record_pass(tracer: "Tracer", epochs: SamplerEpochs, loader: Any) -> None:
    sampler = _shuffling_sampler(loader)
    if sampler is None or not torch.is_grad_enabled() or tracer.root_in_eval_mode() or tracer.skip_compiled():
        return
    new = epochs.new_epoch(sampler)
    if new is None:
        return
    cls = type(loader)
    token = tracer.begin_call(DATALOADER_EPOCH, f"{cls.__module__}.{cls.__qualname__}.__iter__", {},
                              contract={"reshuffles_each_epoch": new})
    tracer.end_call(token)
