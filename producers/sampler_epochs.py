"""Training passes over a ``DistributedSampler`` that shuffles: is each one a new epoch?

``DistributedSampler(shuffle=True)`` seeds its permutation with ``seed + epoch``, and
the epoch changes only when the program calls ``sampler.set_epoch(epoch)``; without it
every epoch replays the first epoch's order and batch composition on every rank
(PyTorch issue 31771), which no loss curve shows.  So each pass of a training loop over
such a loader (``DataLoader.__iter__`` with gradients enabled and the model in training
mode) that an optimizer step follows is recorded with the contract
``reshuffles_each_epoch``: the sampler's epoch differs from the one of its previous
such pass.  The pass also carries the sampler's ``seed``: PyTorch documents that it must
be identical across the processes of the group, since every rank draws the same
permutation and takes its own slice of it; ranks seeded apart draw overlapping shards
(mlcommons/training PR 625), which a cross-rank rule on that argument sees.  Passes without gradients or with the model in evaluation mode (accuracy on
the training set at the end of an epoch) are neither judged nor remembered; loaders
whose sampler does not shuffle record nothing.
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
    """Training passes begun since the last optimizer step, and the epoch each shuffling
    sampler's previous trained pass started from.

    A pass is judged at the first optimizer step after it begins, against the sampler's
    previous pass that an optimizer step followed: a loop may peek at a batch first
    (``next(iter(loader))`` for the batch size, before ``set_epoch``, as PyTorch's DDP
    tutorial does), and only the pass that training consumes is the epoch."""

    def __init__(self) -> None:
        self._last: "weakref.WeakKeyDictionary[DistributedSampler, int]" = weakref.WeakKeyDictionary()
        self._begun: dict[int, tuple["weakref.ref[DistributedSampler]", int, str, Any]] = {}

    def begun(self, sampler: DistributedSampler, loader_name: str) -> None:
        epoch = getattr(sampler, "epoch", None)
        if isinstance(epoch, int):
            self._begun[id(sampler)] = (weakref.ref(sampler), epoch, loader_name, getattr(sampler, "seed", None))

    def judge_begun(self) -> list[tuple[str, bool, Any]]:
        """(loader name, starts a new epoch, sampler seed) of each pass begun since the last step."""
        if not self._begun:
            return []
        verdicts = []
        for ref, epoch, loader_name, seed in self._begun.values():
            sampler = ref()
            if sampler is None:
                continue
            last = self._last.get(sampler)
            self._last[sampler] = epoch
            verdicts.append((loader_name, last is None or last != epoch, seed))
        self._begun.clear()
        return verdicts


def patch_dataloader_epochs(tracer: "Tracer", judge_samplers: bool) -> PatchHandle:
    """Every training pass is an epoch boundary for `producers.epoch_schedules` and
    `producers.epoch_tails`; with
    ``judge_samplers`` a pass over a shuffling ``DistributedSampler`` is also judged."""

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def iterate(loader: Any, *args: Any, **kwargs: Any) -> Any:
            if tracer.enabled and not tracer.busy:
                try:
                    if torch.is_grad_enabled() and not tracer.root_in_eval_mode():
                        tracer.contracts.epoch_schedules.epoch_boundary()
                        tracer.contracts.accumulation.training_pass_begun()
                        sampler = _shuffling_sampler(loader) if judge_samplers else None
                        if sampler is not None:
                            cls = type(loader)
                            tracer.contracts.sampler_epochs.begun(sampler, f"{cls.__module__}.{cls.__qualname__}.__iter__")
                except Exception as exc:
                    tracer.internal_error("DataLoader pass", exc)
            return original(loader, *args, **kwargs)

        return iterate

    return patch_attribute(DataLoader, "__iter__", make)


def record_trained_passes(tracer: "Tracer") -> None:
    """At an optimizer step: the passes it trains on, each with its contract."""
    for name, new, seed in tracer.contracts.sampler_epochs.judge_begun():
        args = {"sampler_seed": seed} if isinstance(seed, int) else {}
        tracer.end_call(tracer.begin_call(DATALOADER_EPOCH, name, args, contract={"reshuffles_each_epoch": new}))
