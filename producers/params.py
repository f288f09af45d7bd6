"""Which parameters exist and what they are called (snapshots: `producers.param_snapshots`).

Names come from the *root* modules the forward hooks see (the outermost module of a
forward call) via ``named_parameters()``, so they are stable across ranks and runs of
the same model: ``0.weight``, ``module.encoder.layers.1.linear1.bias`` under DDP.
Roots after the first with parameters get an ``r<k>.`` prefix (a GAN's second net).
Parameters only an optimizer knows are named ``opt<i>.g<j>.p<k>``.

"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, replace
from typing import Any

import torch

from invariants.events import optimizer_id



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


def same_groups(groups: Any, theirs: Any) -> bool:
    """Whether two optimizers step the very same parameter-group dicts (a wrapper, or an
    optimizer built over another's groups, as SAM's base optimizer is)."""
    return theirs is groups or (isinstance(theirs, list) and isinstance(groups, list) and len(theirs) == len(groups)
                                and all(mine is other for mine, other in zip(groups, theirs)))


class ParameterRegistry:
    """Roots and optimizers seen so far, and the names of their parameters."""

    def __init__(self) -> None:
        self._roots: list[weakref.ref[torch.nn.Module]] = []
        self._root_ids: set[int] = set()
        #: roots first seen running on tensors a functional call swapped in for their parameters
        self._swapped_out: set[int] = set()
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
        if paths is not None and id(root) not in self._swapped_out:
            return paths
        if paths is None:
            paths = {id(module): path for path, module in root.named_modules(remove_duplicate=False)}
            self._module_paths[root] = paths
        if id(root) in self._root_ids:
            return paths
        parameters = list(root.parameters())
        if any(not isinstance(param, torch.nn.Parameter) for param in parameters):
            # ``torch.func.functional_call`` runs the module on tensors it swapped in for
            # the call (under ``vmap``/``grad``, wrappers without storage of their own):
            # its own parameters are indexed at a forward that runs on them
            self._swapped_out.add(id(root))
        elif parameters:
            self._swapped_out.discard(id(root))
            self._root_ids.add(id(root))
            self._roots.append(weakref.ref(root))
            self._index_root(root, len(self._roots) - 1)
        return paths

    def runs_swapped_out(self, module: torch.nn.Module) -> bool:
        """A root seen only running on tensors a functional call swapped in for its parameters."""
        return id(module) in self._swapped_out

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
        what the inner one steps, so both get one index.  So is an optimizer built over
        another's very group dicts (SAM's base optimizer, stepped by the wrapper's
        ``second_step`` while the wrapper clears the gradients)."""
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
            if same_groups(getattr(ref(), "param_groups", None), groups):
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

    def names_in_model(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is a parameter of a model the run has run."""
        entry = self._by_id.get(id(tensor))
        return entry is not None and entry.param is tensor and entry.module is not None

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
