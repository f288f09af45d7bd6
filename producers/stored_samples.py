"""Datasets that write into the samples they store: in-place masking or augmentation of cached data.

A map-style dataset that keeps its samples as tensors (a pre-tokenised corpus, images
loaded once) and edits the sample it returns in place — MLM masking on
``self.input_ids[i]`` without a ``clone()`` (transformers#8619), ``x = self.data[i]``
followed by ``x.add_(noise)`` or ``Normalize(inplace=True)`` — corrupts its own storage:
from the second epoch on, every batch is built from samples already masked, noised or
normalised, and the loss keeps falling.  Nothing in the loop sees it; the tensors'
version counters do (a view shares its base's counter).

A fetch (torch's ``_MapDatasetFetcher.fetch``, what a DataLoader's iterator calls for
each batch in the main process) is judged when the dataset holds sample tensors (two or
more dimensions, a row per sample, no gradient; also inside ``Subset``/``ConcatDataset``
and datasets a wrapper holds).  It breaks the
contract when the stored tensors' version moved during the fetch and every index it
fetched had been fetched before by a fetch that wrote: a cache filled on first access
writes in the fetch that first serves an index, so a later write is for an index
never served before, in whatever pass that happens; only an edit of samples already
served is left.  Fetches that write nothing (every fetch of a healthy dataset) cost
two version reads per storage tensor and nothing more.  The answer reaches the next step of each optimizer as
``keeps_stored_samples`` (`producers.contract_facts`).  Fetches inside DataLoader worker
processes (their dataset is a copy that dies with the worker unless it persists),
iterable datasets, NumPy storage and one-dimensional tensors (counters, labels) are
not judged.
"""

from __future__ import annotations

import operator
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Iterable

import torch
from torch.utils.data import ConcatDataset, Dataset, Subset, get_worker_info
from torch.utils.data._utils.fetch import _MapDatasetFetcher

from .patching import PatchHandle, patch_attribute

if TYPE_CHECKING:
    from .tracer import Tracer

#: how deep nested datasets (Subset of a ConcatDataset of ...) are searched for storage
MAX_NESTING = 4
#: storages whose fetched indices are remembered (the oldest forgotten first)
MAX_STORAGES = 64


def stored_sample_tensors(dataset: Any, depth: int = 0) -> list[torch.Tensor]:
    """The tensors a dataset keeps its samples in: attributes (or tuples and lists of
    them, as ``TensorDataset.tensors``) with two or more dimensions, one row per sample
    (as many as the dataset's length) and no gradient, its own or those of the datasets
    it wraps.  A scratch buffer shaped like one sample is not storage."""
    if depth > MAX_NESTING:
        return []
    if isinstance(dataset, Subset):
        return stored_sample_tensors(dataset.dataset, depth + 1)
    if isinstance(dataset, ConcatDataset):
        return [t for part in dataset.datasets for t in stored_sample_tensors(part, depth + 1)]
    try:
        size = len(dataset)
    except TypeError:
        size = None
    found: list[torch.Tensor] = []
    for value in getattr(dataset, "__dict__", {}).values():
        if isinstance(value, Dataset):  # a wrapper (transforms, a view) over the dataset that stores
            found += stored_sample_tensors(value, depth + 1)
            continue
        for item in value if isinstance(value, (tuple, list)) and len(value) <= 16 else (value,):
            if (isinstance(item, torch.Tensor) and item.dim() >= 2 and item.shape[0] == size
                    and not item.requires_grad):
                found.append(item)
    return found


class FetchedIndices:
    """Which indices of one dataset were served before, as a bitmap (a dataset of a
    million samples costs 125 kB); once every index was, only that is kept."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._bits: bytearray | None = bytearray((size + 7) // 8)
        self._count = 0

    def all_seen_then_mark(self, indices: Iterable[Any]) -> bool:
        """Whether every index was served before; marks them served."""
        bits = self._bits
        if bits is None:
            return True
        seen = True
        for key in indices:
            try:
                index = operator.index(key)  # ints, NumPy and 0-d integer tensor indices
            except TypeError:
                index = -1
            if not 0 <= index < self.size:
                seen = False  # keys that are no positions: judged as new
                continue
            byte, mask = index >> 3, 1 << (index & 7)
            if bits[byte] & mask:
                continue
            seen = False
            bits[byte] |= mask
            self._count += 1
        if self._count >= self.size:
            self._bits = None
        return seen


class StoredSamples:
    """Judges fetches; each optimizer step learns whether a fetch since its previous step broke the contract."""

    def __init__(self) -> None:
        # id(dataset) -> (weak reference, its storage, the indices its writing fetches served);
        # a dataset without storage is kept with none, and not judged
        self._datasets: dict[int, tuple[Any, list[torch.Tensor], FetchedIndices]] = {}
        # storage (length, addresses) -> indices served by writing fetches: a dataset built
        # anew each epoch over the same tensors has served what its predecessors served
        self._fetched: "OrderedDict[tuple[int, tuple[int, ...]], FetchedIndices]" = OrderedDict()
        self._fetches = 0  # judged fetches so far
        self._last_broken = -1  # the number of the latest fetch that broke the contract
        self._seen_by: dict[int, int] = {}  # id(optimizer) -> judged fetches at its previous step

    def _state(self, dataset: Any) -> tuple[Any, list[torch.Tensor], FetchedIndices]:
        key = id(dataset)
        state = self._datasets.get(key)
        if state is not None and state[0]() is dataset:
            return state
        try:
            ref = weakref.ref(dataset, lambda _dead, key=key: self._datasets.pop(key, None))
        except TypeError:  # no weak references: looked at afresh on every fetch
            ref = None
        tensors = stored_sample_tensors(dataset)
        state = (ref, tensors, self._indices_of(len(dataset), tensors) if tensors else FetchedIndices(0))
        if ref is not None:
            self._datasets[key] = state
        return state

    def _indices_of(self, size: int, tensors: list[torch.Tensor]) -> FetchedIndices:
        storage = (size, tuple(tensor.data_ptr() for tensor in tensors))
        fetched = self._fetched.get(storage)
        if fetched is None:
            fetched = self._fetched[storage] = FetchedIndices(size)
            if len(self._fetched) > MAX_STORAGES:
                self._fetched.popitem(last=False)
        return fetched

    def before_fetch(self, fetcher: Any) -> tuple[list[torch.Tensor], list[int], FetchedIndices] | None:
        """The storage's versions before a fetch; None when the dataset is not judged."""
        _ref, tensors, fetched = self._state(fetcher.dataset)
        if not tensors:
            return None
        return tensors, [tensor._version for tensor in tensors], fetched

    def after_fetch(self, before: tuple[list[torch.Tensor], list[int], FetchedIndices], auto_collation: bool,
                    indices: Any) -> None:
        tensors, versions, fetched = before
        if any(tensor._version != version for tensor, version in zip(tensors, versions)) and (
                fetched.all_seen_then_mark(indices if auto_collation else (indices,))):
            self._last_broken = self._fetches
        self._fetches += 1

    def keeps_stored_samples(self, optimizer: torch.optim.Optimizer) -> bool | None:
        """None when no judged fetch happened since this optimizer's previous step."""
        previous = self._seen_by.get(id(optimizer), 0)
        self._seen_by[id(optimizer)] = self._fetches
        if self._fetches == previous:
            return None
        return self._last_broken < previous


def patch_dataset_fetches(tracer: "Tracer") -> PatchHandle:
    """Judge every batch a DataLoader fetches in this process (not in its workers)."""
    stored = tracer.contracts.stored_samples

    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def fetch(fetcher: Any, possibly_batched_index: Any) -> Any:
            if not tracer.enabled or tracer.busy or get_worker_info() is not None:
                return original(fetcher, possibly_batched_index)
            try:
                before = stored.before_fetch(fetcher)
            except Exception as exc:
                tracer.internal_error("dataset fetch", exc)
                before = None
            batch = original(fetcher, possibly_batched_index)
            if before is not None:
                try:
                    stored.after_fetch(before, fetcher.auto_collation, possibly_batched_index)
                except Exception as exc:
                    tracer.internal_error("dataset fetch", exc)
            return batch

        return fetch

    return patch_attribute(_MapDatasetFetcher, "fetch", make)
