"""The training batches a data-parallel replica drew since its latest optimizer step.

Data parallelism trains each replica on its own share of the data and averages their
gradients; ranks that draw the same batches average copies of one gradient, so the job
trains on a fraction of its global batch while every curve looks normal.  It is the
most common way to get DDP wrong: a plain ``RandomSampler`` or ``WeightedRandomSampler``
seeded alike on every rank instead of a ``DistributedSampler`` (PyTorch issue 77154,
Lightning issue 10946), or an ``IterableDataset`` that does not split its stream by
rank.  Nothing in one process shows it; two ranks' batches side by side do.

So every batch a DataLoader yields in a multi-process run, with gradients enabled and
the model in training mode, is digested here, and the optimizer step that consumes the
batches carries the digest of all of them as its argument ``batch_digest`` (only in a
replica: `producers.replicas`).  A cross-rank rule then asks that no two ranks' i-th
step of a window trained on the same batches.  Batches a step did not draw (the
generator's step of a GAN after the discriminator's) leave no digest, and so do batches
on an accelerator: reading them back would block the device queue.  The tensors of a
batch are hashed in full up to ``_SAMPLED_ELEMENTS`` elements and by an even stride
beyond, which bounds the cost of a large image batch to a few milliseconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch
import xxhash
from torch.utils.data import dataloader

from .digest import cpu_digest
from .patching import PatchHandle, patch_attribute
from .replicas import several_ranks

if TYPE_CHECKING:
    from .tracer import Tracer

#: elements of one tensor hashed in full; a larger one is hashed by an even stride
_SAMPLED_ELEMENTS = 1 << 20
#: how deep and how many tensors of a nested batch (dicts of tensors, tuples of lists)
_MAX_DEPTH = 4
_MAX_LEAVES = 16
#: digests kept between two optimizer steps before they are folded into one
_MAX_PENDING = 64


def _leaves(batch: Any, depth: int = 0) -> list[torch.Tensor]:
    """The tensors of a batch, in a stable order (dict insertion, sequence order)."""
    if isinstance(batch, torch.Tensor):
        return [batch]
    if depth >= _MAX_DEPTH:
        return []
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    found: list[torch.Tensor] = []
    for item in items:
        found.extend(_leaves(item, depth + 1))
        if len(found) >= _MAX_LEAVES:
            return found[:_MAX_LEAVES]
    return found


def batch_digest(batch: Any) -> str | None:
    """A digest of a batch's CPU tensors; None when it has none to read without a device sync."""
    tensors = [t for t in _leaves(batch)
               if t.device.type == "cpu" and t.layout == torch.strided and not t.is_meta]
    if not tensors:
        return None
    hasher = xxhash.xxh3_64()
    for tensor in tensors:
        plain = tensor.detach()
        if plain.numel() > _SAMPLED_ELEMENTS:
            plain = plain.reshape(-1)[:: plain.numel() // _SAMPLED_ELEMENTS]
            hasher.update(str(tuple(tensor.shape)).encode())
        hasher.update(cpu_digest(plain).encode())
    return hasher.hexdigest()


class ReplicaBatches:
    """The digests of the training batches drawn since the latest optimizer step."""

    def __init__(self) -> None:
        self._drawn: list[str] = []

    def yielded(self, batch: Any) -> None:
        digest = batch_digest(batch)
        if digest is not None:
            self._drawn.append(digest)
            if len(self._drawn) > _MAX_PENDING:  # a loop without an optimizer never takes them
                self._drawn = [_combined(self._drawn)]

    def take(self) -> str | None:
        """For an optimizer step: the digest of the batches it trains on, once."""
        if not self._drawn:
            return None
        drawn, self._drawn = self._drawn, []
        return drawn[0] if len(drawn) == 1 else _combined(drawn)


def _combined(digests: list[str]) -> str:
    return xxhash.xxh3_64_hexdigest("|".join(digests))


def patch_batch_yields(tracer: "Tracer") -> PatchHandle:
    """Count every batch a DataLoader yields (`producers.loss_averaging`) and, in a
    multi-process run's training pass, digest it.

    Every DataLoader iterator, single- or multi-process, is a ``_BaseDataLoaderIter``
    whose ``__next__`` yields one batch: the one private name this relies on (tested in
    ``tests/integration/test_loss_averaging.py``, torch 2.x)."""
    contracts = tracer.contracts

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def yielded(iterator: Any) -> Any:
            batch = original(iterator)
            contracts.accumulation.batch_yielded()
            if tracer.enabled and not tracer.busy and several_ranks():
                try:
                    if torch.is_grad_enabled() and not tracer.root_in_eval_mode():
                        contracts.replica_batches.yielded(batch)
                except Exception as exc:
                    tracer.internal_error("batch digest", exc)
            return batch

        return yielded

    return patch_attribute(dataloader._BaseDataLoaderIter, "__next__", make)
