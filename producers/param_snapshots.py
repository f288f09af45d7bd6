"""Cheap snapshots of every parameter a registry knows: data and gradient summaries.

A snapshot of every parameter must stay cheap on large models: norms of all tensors
are computed in one ``torch._foreach_norm`` per list and cross to the host in one
transfer per device; digests follow `producers.digest`. Metadata that cannot change
between snapshots is read once per parameter (`SnapshotMemo`).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Iterable, Sequence

import torch

from .digest import local_data, skip_reason, tensor_digests
from .params import ParamEntry
from . import readback as _readback
from .readback import Readback, put
from .summaries import device_name as _device_name
from .summaries import tensor_layout as _layout

#: Attributes that Megatron-LM / DeepSpeed-style frameworks set on parameters to say how
#: they are sharded; captured when present so cross-rank rules can be scoped.
PARALLEL_ATTRIBUTES = (
    "tensor_model_parallel", "partition_dim", "partition_stride", "sequence_parallel",
    "allreduce", "expert", "moe", "group_name", "shared",
)


def tensor_norms(tensors: Sequence[torch.Tensor | None], readback: Readback | None = None) -> list[Any]:
    """Euclidean norms of float tensors: one fused kernel and one host transfer per (device, dtype).

    With a ``readback``, the norms of tensors it `defers <producers.readback.defers>`
    stay on their device and come back as `Deferred` values.
    """
    results: list[Any] = [None] * len(tensors)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for index, tensor in enumerate(tensors):
        if tensor is None or not (tensor.is_floating_point() or tensor.is_complex()):
            continue
        if tensor.numel() == 0 or skip_reason(tensor) is not None:
            continue
        groups.setdefault((tensor.device, tensor.dtype), []).append(index)
    for indices in groups.values():
        norms = torch._foreach_norm([tensors[i] for i in indices])  # type: ignore[misc]
        if readback is not None and _readback.defers(tensors[indices[0]]):  # type: ignore[arg-type]
            for index, deferred in zip(indices, readback.norms(torch.stack(norms))):
                results[index] = deferred
            continue
        values = torch.stack(norms).tolist()
        for index, value in zip(indices, values):
            results[index] = float(value)
    return results


def _version_of(tensor: torch.Tensor) -> int | None:
    """The autograd version counter; None where there is none (inference-mode tensors)."""
    try:
        return tensor._version
    except RuntimeError:
        return None


class SnapshotMemo:
    """What one snapshot can reuse from the previous ones of the same parameters.

    *Gradient digests and norms*, reused while the gradient is unchanged.

    Between two snapshots of one step the gradients usually stay as they were (nothing
    touches them in ``Optimizer.step``, nor between the end of a step and the next
    ``zero_grad``), so summarising them again is a wasted pass over gradient memory.
    A cached summary is reused only for the very same gradient tensor object whose
    autograd version counter has not moved: every in-place change made through the
    tensor (``grad.div_()``, accumulation by backward, ``zero_()``, a collective
    writing into it) bumps that counter.  Only changes made through ``grad.data``,
    which has a counter of its own, would go unseen; parameter *data* is therefore
    never cached (``param.data.add_()`` is a common way to modify weights).
    Gradients are held by weak reference so the cache never keeps memory alive.

    *Metadata attributes* of each parameter (see `_static_attrs`).  Entries are keyed
    by ``id(param)`` and checked against a weak reference, since tensors cannot be
    dictionary keys by value (``==`` is elementwise).
    """

    def __init__(self) -> None:
        # digest and norm may be `Deferred` values still on their way from a device:
        # reusing one fills the new snapshot when the first one is resolved
        self._entries: dict[int, tuple[weakref.ref[torch.Tensor], int, Any, Any]] = {}
        self._static: dict[int, tuple[weakref.ref[torch.Tensor], tuple[Any, ...], dict[str, Any]]] = {}

    def static_attrs(self, param: torch.Tensor, key: tuple[Any, ...]) -> dict[str, Any] | None:
        entry = self._static.get(id(param))
        if entry is None or entry[0]() is not param or entry[1] != key:
            return None
        return entry[2]

    def store_static_attrs(self, param: torch.Tensor, key: tuple[Any, ...], attrs: dict[str, Any]) -> None:
        try:
            self._static[id(param)] = (weakref.ref(param), key, attrs)
        except TypeError:
            pass

    def lookup(self, param: torch.Tensor, grad: torch.Tensor) -> tuple[Any, Any] | None:
        entry = self._entries.get(id(param))
        if entry is None or entry[0]() is not grad or entry[1] != _version_of(grad):
            return None
        return entry[2], entry[3]

    def store(self, param: torch.Tensor, grad: torch.Tensor, digest: Any, norm: Any) -> None:
        version = _version_of(grad)
        if version is None:
            return
        try:
            self._entries[id(param)] = (weakref.ref(grad), version, digest, norm)
        except TypeError:  # a tensor type without weak references: just do not cache it
            pass

    def clear(self) -> None:
        self._entries.clear()
        self._static.clear()


def snapshot_attrs(
    entries: Iterable[ParamEntry],
    *,
    data: bool = True,
    memo: "SnapshotMemo | None" = None,
    defer: Callable[[Readback], None] | None = None,
) -> list[tuple[ParamEntry, dict[str, Any]]]:
    """Attributes of each parameter: metadata, grad digest/norm and (if ``data``) data digest/norm.

    Around ``zero_grad`` only gradients can change, so those snapshots skip the data
    (the most expensive half on large models); the step snapshots carry both.  A tied
    parameter is digested once and reported under each of its names.  Everything
    still to be summarised goes through one digest call and one batched norm call, so
    the fixed cost per snapshot does not grow with the number of kinds of tensors.

    With ``defer``, results computed on an accelerator are not waited for: their
    attributes read ``None`` until the `Readback` handed to ``defer`` is resolved,
    which fills them in place (the caller must not ship them before).
    """
    entries = list(entries)
    primaries = [entry for entry in entries if entry.alias_of is None]
    count = len(primaries)
    grad_digests: list[Any] = [None] * count
    grad_norms: list[Any] = [None] * count
    readback = Readback() if defer is not None and not _readback.IMMEDIATE else None
    on_device = True if readback is not None and _readback.FORCE_DEFERRED else None
    with torch.no_grad():
        grads = [entry.param.grad for entry in primaries]
        # (position in primaries, tensor) of gradients that need summarising now
        todo: list[tuple[int, torch.Tensor]] = []
        for index, grad in enumerate(grads):
            if grad is None:
                continue
            cached = memo.lookup(primaries[index].param, grad) if memo is not None else None
            if cached is None:
                todo.append((index, local_data(grad.detach())))
            else:
                grad_digests[index], grad_norms[index] = cached
        datas = [local_data(entry.param.detach()) for entry in primaries] if data else []
        tensors = datas + [tensor for _, tensor in todo]
        digests = tensor_digests(tensors, on_device=on_device, readback=readback)
        norms = tensor_norms(tensors, readback)
        if readback is not None and readback.start():
            defer(readback)  # type: ignore[misc]
    for offset, (index, _) in enumerate(todo, start=len(datas)):
        grad_digests[index], grad_norms[index] = digests[offset], norms[offset]
        if memo is not None:
            memo.store(primaries[index].param, grads[index], digests[offset], norms[offset])  # type: ignore[arg-type]

    def fill(attrs: dict[str, Any], index: int) -> dict[str, Any]:
        put(attrs, "grad_digest", grad_digests[index])
        put(attrs, "grad_norm", grad_norms[index])
        if data:
            put(attrs, "data_digest", digests[index])
            put(attrs, "data_norm", norms[index])
        return attrs

    by_param: dict[int, tuple[int, dict[str, Any]]] = {}
    for index, entry in enumerate(primaries):
        by_param[id(entry.param)] = (index, fill(dict(_static_attrs(entry, entry.param, memo)), index))
    results = []
    for entry in entries:
        found = by_param.get(id(entry.param))
        if found is None:
            continue  # an alias whose primary is not part of this snapshot
        index, attrs = found
        if entry.alias_of is not None:
            attrs = {**attrs, "module": entry.module, "mtype": entry.mtype, "alias_of": entry.alias_of}
            if readback is not None:
                fill(attrs, index)  # values still on their way must reach the copy too
        results.append((entry, attrs))
    return results


def _static_attrs(entry: ParamEntry, param: torch.Tensor, memo: "SnapshotMemo | None") -> dict[str, Any]:
    """A parameter's metadata attributes, rebuilt only when something they derive from changed.

    The same parameters are snapshotted several times per step; their shape, dtype,
    device and flags almost never change, and turning them into strings and lists
    per snapshot is most of a small parameter's snapshot cost.  The key is read from
    the tensor every time, so a change (``requires_grad_(False)``, ``.to()``) shows;
    sharding marks (`PARALLEL_ATTRIBUTES`) are read when the parameter is first seen,
    which is when frameworks set them.
    """
    key = (param.shape, param.dtype, param.device, param.requires_grad, param.is_leaf, entry.module, entry.mtype,
           entry.holder)
    cached = memo.static_attrs(param, key) if memo is not None else None
    if cached is not None:
        return cached
    shape, dtype, numel = _layout(param)
    attrs: dict[str, Any] = {
        "shape": list(shape),
        "dtype": dtype,
        "device": _device_name(param.device),
        "requires_grad": param.requires_grad,
        "is_leaf": param.is_leaf,
        "numel": numel,
        "grad_digest": None,
        "grad_norm": None,
        "module": entry.module,
        "mtype": entry.mtype,
    }
    if entry.holder is not None:
        attrs["holder"] = entry.holder
    reason = skip_reason(local_data(param))
    if reason is not None:
        attrs["digest_skipped"] = reason
    parallel = _parallel_attributes(param)
    if parallel:
        attrs["parallel"] = parallel
    if memo is not None:
        memo.store_static_attrs(param, key, attrs)
    return attrs


def _parallel_attributes(param: torch.Tensor) -> dict[str, Any]:
    """Sharding marks: the attributes Megatron/DeepSpeed-style frameworks set, and
    ``sharded`` for parameters PyTorch itself shards (a DTensor with a ``Shard``
    placement under FSDP2 or tensor parallelism; FSDP1's flat parameters)."""
    marks: dict[str, Any] = {}
    placements = getattr(param, "placements", None) if type(param) not in (torch.Tensor, torch.nn.Parameter) else None
    if placements is not None and any(getattr(p, "is_shard", lambda: False)() for p in placements):
        marks["sharded"] = True
    if type(param).__name__ == "FlatParameter":
        marks["sharded"] = True
    extra = getattr(param, "__dict__", None)
    if extra:
        marks.update({
            key: extra[key]
            for key in PARALLEL_ATTRIBUTES
            if key in extra and (extra[key] is None or isinstance(extra[key], (bool, int, float, str)))
        })
    return marks
