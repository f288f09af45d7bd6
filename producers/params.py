"""Which parameters exist, what they are called, and cheap snapshots of all of them.

Names come from the *root* modules the forward hooks see (the outermost module of a
forward call) via ``named_parameters()``, so they are stable across ranks and runs of
the same model: ``0.weight``, ``module.encoder.layers.1.linear1.bias`` under DDP.
Roots after the first with parameters get an ``r<k>.`` prefix (a GAN's second net).
Parameters only an optimizer knows are named ``opt<i>.g<j>.p<k>``.

A snapshot of every parameter must stay cheap on large models: norms of all tensors
are computed in one ``torch._foreach_norm`` per list and cross to the host in one
transfer per device; digests follow `producers.digest`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace
from typing import Any, Iterable, Sequence

import torch

from invariants.events import optimizer_id

from .digest import skip_reason, tensor_digests
from .summaries import device_name as _device_name
from .summaries import tensor_layout as _layout


@dataclass(frozen=True)
class ParamEntry:
    name: str
    param: torch.Tensor
    module: str | None
    mtype: str | None
    #: for a tied parameter's second (third...) name: the name it is snapshotted under first
    alias_of: str | None = None
    #: ``opt<i>.g<j>``: the first optimizer and param group holding it
    holder: str | None = None


#: Attributes that Megatron-LM / DeepSpeed-style frameworks set on parameters to say how
#: they are sharded; captured when present so cross-rank rules can be scoped.
PARALLEL_ATTRIBUTES = (
    "tensor_model_parallel", "partition_dim", "partition_stride", "sequence_parallel",
    "allreduce", "expert", "moe", "group_name", "shared",
)


class ParameterRegistry:
    """Roots and optimizers seen so far, and the names of their parameters."""

    def __init__(self) -> None:
        self._roots: list[weakref.ref[torch.nn.Module]] = []
        self._root_ids: set[int] = set()
        self._optimizers: list[weakref.ref[torch.optim.Optimizer]] = []
        self._optimizer_ids: dict[int, int] = {}
        self._by_id: dict[int, ParamEntry] = {}
        self._aliases: list[ParamEntry] = []  # tied parameters under their other names
        #: names may be out of date (a new root, or an optimizer parameter no root named)
        self.stale = False
        self._module_paths: "weakref.WeakKeyDictionary[torch.nn.Module, dict[int, str]]" = weakref.WeakKeyDictionary()

    # -- discovery ------------------------------------------------------------------
    def add_root(self, root: torch.nn.Module) -> dict[int, str]:
        """Remember a root module; returns ``id(submodule) -> path`` for module events."""
        paths = self._module_paths.get(root)
        if paths is not None:
            return paths
        paths = {id(module): path for path, module in root.named_modules(remove_duplicate=False)}
        self._module_paths[root] = paths
        if id(root) not in self._root_ids and any(True for _ in root.parameters()):
            self._root_ids.add(id(root))
            self._roots.append(weakref.ref(root))
            self._index_root(root, len(self._roots) - 1)
        return paths

    def roots(self) -> list[torch.nn.Module]:
        return [root for root in (ref() for ref in self._roots) if root is not None]

    def root_index(self, module: torch.nn.Module) -> int | None:
        """``m<i>``: the model's index among roots, in order of first forward."""
        if id(module) not in self._root_ids:
            return None
        for index, ref in enumerate(self._roots):
            if ref() is module:
                return index
        return None

    def is_model_root(self, module: torch.nn.Module) -> bool:
        """A root that owns parameters (a model, not a loss or activation module)."""
        return id(module) in self._root_ids

    def add_optimizer(self, optimizer: torch.optim.Optimizer) -> int:
        """The optimizer's stable index.  A wrapper that shares another optimizer's
        ``param_groups`` list (Lightning's ``LightningOptimizer``, Accelerate's
        ``AcceleratedOptimizer``) is that optimizer: its ``zero_grad`` clears exactly
        what the inner one steps, so both get one index."""
        index = self._optimizer_ids.get(id(optimizer))
        if index is None:
            index = self._wrapped_index(optimizer)
            if index is not None:
                self._optimizer_ids[id(optimizer)] = index
                return index
            index = len(self._optimizers)
            self._optimizer_ids[id(optimizer)] = index
            self._optimizers.append(weakref.ref(optimizer))
            self._index_optimizer(optimizer, index)
        return index

    def _wrapped_index(self, optimizer: torch.optim.Optimizer) -> int | None:
        groups = getattr(optimizer, "param_groups", None)
        if groups is None:
            return None
        for index, ref in enumerate(self._optimizers):
            other = ref()
            if other is not None and getattr(other, "param_groups", None) is groups:
                return index
        return None

    def refresh(self) -> None:
        """Re-read names (modules may have been swapped since); called once per step."""
        self._by_id = {}
        self._aliases = []
        for index, root_ref in enumerate(self._roots):
            root = root_ref()
            if root is not None:
                self._module_paths.pop(root, None)
                self._module_paths[root] = {
                    id(m): p for p, m in root.named_modules(remove_duplicate=False)
                }
                self._index_root(root, index)
        for index, opt_ref in enumerate(self._optimizers):
            optimizer = opt_ref()
            if optimizer is not None:
                self._index_optimizer(optimizer, index)
        self.stale = False

    def _index_root(self, root: torch.nn.Module, index: int) -> None:
        prefix = "" if index == 0 else f"r{index}."
        for module_path, module in root.named_modules():
            mtype = type(module).__name__
            for local_name, param in module.named_parameters(recurse=False):
                name = prefix + (f"{module_path}.{local_name}" if module_path else local_name)
                existing = self._by_id.get(id(param))
                if existing is not None and existing.module is not None:
                    # A tied parameter: also snapshot it under this name, so that a tie
                    # that breaks later shows up as two names whose digests part.
                    if existing.name != name:
                        self._aliases.append(ParamEntry(name, param, module_path, mtype, alias_of=existing.name))
                    continue
                holder = existing.holder if existing is not None else None
                self._by_id[id(param)] = ParamEntry(name, param, module_path, mtype, holder=holder)

    def _index_optimizer(self, optimizer: torch.optim.Optimizer, index: int) -> None:
        for group_index, group in enumerate(optimizer.param_groups):
            holder = f"{optimizer_id(index)}.g{group_index}"
            for param_index, param in enumerate(group.get("params", ())):
                existing = self._by_id.get(id(param))
                if existing is None:
                    name = f"{holder}.p{param_index}"
                    self._by_id[id(param)] = ParamEntry(name, param, None, None, holder=holder)
                    # A parameter no root named yet: modules may have been swapped.
                    self.stale = True
                elif existing.holder is None:
                    self._by_id[id(param)] = replace(existing, holder=holder)

    # -- lookups --------------------------------------------------------------------
    def name_of(self, tensor: torch.Tensor) -> str | None:
        entry = self._by_id.get(id(tensor))
        return entry.name if entry is not None and entry.param is tensor else None

    def all_entries(self) -> list[ParamEntry]:
        return list(self._by_id.values()) + self._aliases

    def optimizer_entries(self, optimizer: torch.optim.Optimizer) -> list[ParamEntry]:
        entries = []
        for group in optimizer.param_groups:
            for param in group.get("params", ()):
                entry = self._by_id.get(id(param))
                if entry is None or entry.param is not param:
                    self._index_optimizer(optimizer, self.add_optimizer(optimizer))
                    entry = self._by_id.get(id(param))
                if entry is not None:
                    entries.append(entry)
        if self._aliases:
            mine = {id(entry.param) for entry in entries}
            entries.extend(alias for alias in self._aliases if id(alias.param) in mine)
        return entries


def _norms(tensors: Sequence[torch.Tensor | None]) -> list[float | None]:
    """Euclidean norms of float tensors: one fused kernel and one host transfer per (device, dtype)."""
    results: list[float | None] = [None] * len(tensors)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for index, tensor in enumerate(tensors):
        if tensor is None or not (tensor.is_floating_point() or tensor.is_complex()):
            continue
        if tensor.numel() == 0 or skip_reason(tensor) is not None:
            continue
        groups.setdefault((tensor.device, tensor.dtype), []).append(index)
    for indices in groups.values():
        norms = torch._foreach_norm([tensors[i] for i in indices])  # type: ignore[misc]
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
        self._entries: dict[int, tuple[weakref.ref[torch.Tensor], int, str | None, float | None]] = {}
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

    def lookup(self, param: torch.Tensor, grad: torch.Tensor) -> tuple[str | None, float | None] | None:
        entry = self._entries.get(id(param))
        if entry is None or entry[0]() is not grad or entry[1] != _version_of(grad):
            return None
        return entry[2], entry[3]

    def store(self, param: torch.Tensor, grad: torch.Tensor, digest: str | None, norm: float | None) -> None:
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
    entries: Iterable[ParamEntry], *, data: bool = True, memo: "SnapshotMemo | None" = None
) -> list[tuple[ParamEntry, dict[str, Any]]]:
    """Attributes of each parameter: metadata, grad digest/norm and (if ``data``) data digest/norm.

    Around ``zero_grad`` only gradients can change, so those snapshots skip the data
    (the most expensive half on large models); the step snapshots carry both.  A tied
    parameter is digested once and reported under each of its names.  Everything
    still to be summarised goes through one digest call and one batched norm call, so
    the fixed cost per snapshot does not grow with the number of kinds of tensors.
    """
    entries = list(entries)
    primaries = [entry for entry in entries if entry.alias_of is None]
    count = len(primaries)
    grad_digests: list[str | None] = [None] * count
    grad_norms: list[float | None] = [None] * count
    with torch.no_grad():
        grads = [entry.param.grad for entry in primaries]
        # (position in primaries, tensor) of gradients that need summarising now
        todo: list[tuple[int, torch.Tensor]] = []
        for index, grad in enumerate(grads):
            if grad is None:
                continue
            cached = memo.lookup(primaries[index].param, grad) if memo is not None else None
            if cached is None:
                todo.append((index, grad.detach()))
            else:
                grad_digests[index], grad_norms[index] = cached
        datas = [entry.param.detach() for entry in primaries] if data else []
        tensors = datas + [tensor for _, tensor in todo]
        digests = tensor_digests(tensors)
        norms = _norms(tensors)
    for offset, (index, _) in enumerate(todo, start=len(datas)):
        grad_digests[index], grad_norms[index] = digests[offset], norms[offset]
        if memo is not None:
            memo.store(primaries[index].param, grads[index], digests[offset], norms[offset])  # type: ignore[arg-type]
    by_param: dict[int, dict[str, Any]] = {}
    for index, entry in enumerate(primaries):
        param = entry.param
        attrs = dict(_static_attrs(entry, param, memo))
        attrs["grad_digest"] = grad_digests[index]
        attrs["grad_norm"] = grad_norms[index]
        if data:
            attrs["data_digest"] = digests[index]
            attrs["data_norm"] = norms[index]
        by_param[id(param)] = attrs
    results = []
    for entry in entries:
        attrs = by_param.get(id(entry.param))
        if attrs is None:
            continue  # an alias whose primary is not part of this snapshot
        if entry.alias_of is not None:
            attrs = {**attrs, "module": entry.module, "mtype": entry.mtype, "alias_of": entry.alias_of}
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
    reason = skip_reason(param)
    if reason is not None:
        attrs["digest_skipped"] = reason
    parallel = _parallel_attributes(param)
    if parallel:
        attrs["parallel"] = parallel
    if memo is not None:
        memo.store_static_attrs(param, key, attrs)
    return attrs


def _parallel_attributes(param: torch.Tensor) -> dict[str, Any]:
    extra = getattr(param, "__dict__", None)
    if not extra:
        return {}
    return {
        key: extra[key]
        for key in PARALLEL_ATTRIBUTES
        if key in extra and (extra[key] is None or isinstance(extra[key], (bool, int, float, str)))
    }
