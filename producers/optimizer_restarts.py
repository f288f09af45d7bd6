"""An optimizer rebuilt over the parameters it was already training, its state thrown away.

Adam's moment estimates, momentum buffers and step counts live in the optimizer object;
constructing it again inside the loop (once an epoch, after every evaluation) starts
them over each time, and the updates become bias-corrected first steps whatever the
gradient history says.  Nothing fails.  What tells this apart from the healthy reasons
to build a second optimizer (a fine-tuning phase with another learning rate or
algorithm, a new model in a sweep or a cross-validation fold, a resume that loads the
old state) is judged at the new optimizer's first step:

* the same class and the same initial learning rates as an optimizer that stepped
  before it with state (plain SGD without momentum keeps none, so loses nothing);
* over exactly that optimizer's parameters, every one of them trained already in this
  run (a new model's parameters can reuse the addresses of a freed one's, never its
  training);
* with no state of its own (``load_state_dict`` of the old state keeps it);
* with none of them restored (``Module.load_state_dict``) or written in place since an
  optimizer last stepped them: a restart from a checkpoint that kept no optimizer state,
  or a rewind to the initial weights (the lottery-ticket recipe copies them back by
  hand), starts over on purpose, with weights that are not the ones the old state was
  built on;
* and with no parameter that takes a gradient now for the first time at a step: a
  part of the model that starts to train begins a new phase, and resetting the state
  there is a recipe (progressive growing resets Adam at each new resolution,
  tkarras/progressive_growing_of_gans ``reset_opt_for_new_lod``), while the rebuilt
  optimizer of the bug steps the same gradients as before.  Parameters that never take
  a gradient (an unused pooler) do not count.
"""

from __future__ import annotations

import weakref
from typing import Callable, Iterable

import torch

from .ownership import optimizer_param_ids

Signature = tuple[type, frozenset[int], tuple[float, ...]]
#: parameters per group whose version counters are read after each step
VERSIONS_READ = 4


def _initial_learning_rates(optimizer: torch.optim.Optimizer) -> tuple[float, ...]:
    rates = []
    for group in optimizer.param_groups:
        rate = group.get("initial_lr", group.get("lr"))
        rates.append(float(rate) if isinstance(rate, (int, float)) else float("nan"))
    return tuple(rates)


class OptimizerRestarts:
    """Remembers the optimizers that stepped with state; judges each new one's first step."""

    def __init__(self, is_trained: Callable[[torch.Tensor], bool]) -> None:
        self._is_trained = is_trained
        self._initial: "weakref.WeakKeyDictionary[torch.optim.Optimizer, tuple[float, ...]]" = weakref.WeakKeyDictionary()
        self._judged: "weakref.WeakSet[torch.optim.Optimizer]" = weakref.WeakSet()
        self._remembered: "weakref.WeakSet[torch.optim.Optimizer]" = weakref.WeakSet()
        #: signatures of optimizers that have stepped holding state (bounded: one per
        #: class, parameter set and learning rates, however often it is rebuilt)
        self._stateful: dict[Signature, int] = {}  # -> the restore count when it was remembered
        self._restores = 0
        self._restored_at: dict[int, int] = {}  # id(parameter) -> the restore count of its last restore
        #: id(parameter) -> its version counter after the latest step that updated it (a few
        #: parameters of each optimizer): a write since then rewound or replaced the weights
        self._stepped_version: dict[int, int] = {}
        #: ids of parameters that held a gradient at some optimizer step, and per optimizer
        #: those of its parameters not seen with one yet (usually empty after its first step)
        self._had_grad: set[int] = set()
        self._without_grad: "weakref.WeakKeyDictionary[torch.optim.Optimizer, tuple[int, list[torch.Tensor]]]" = (
            weakref.WeakKeyDictionary())

    def constructed(self, optimizer: torch.optim.Optimizer) -> None:
        self._initial[optimizer] = _initial_learning_rates(optimizer)

    def restored(self, params: Iterable[torch.Tensor]) -> None:
        """``Module.load_state_dict`` gave these parameters values from a state dict."""
        self._restores += 1
        for param in params:
            self._restored_at[id(param)] = self._restores

    def keeps_state(self, optimizer: torch.optim.Optimizer) -> bool:
        """False at the first step of an optimizer that restarts a predecessor's state."""
        if optimizer in self._judged:
            return True
        self._judged.add(optimizer)
        remembered_at = None if optimizer.state else self._stateful.get(self._signature(optimizer))
        if remembered_at is None:
            return True
        params = [p for group in optimizer.param_groups for p in group.get("params", ())]
        if any(self._restored_at.get(id(p), -1) > remembered_at for p in params):
            return True
        if any(self._stepped_version.get(id(p), p._version) != p._version for p in params):
            return True  # written since an optimizer last stepped it: rewound or replaced
        if any(p.grad is not None and id(p) not in self._had_grad for p in params):
            return True  # a part that starts to train: a new phase
        return not (params and all(self._is_trained(p) for p in params))

    def stepped(self, optimizer: torch.optim.Optimizer) -> None:
        """After a step: the first one that leaves state makes the optimizer remembered;
        the parameters it found gradients on are noted."""
        if optimizer.state and optimizer not in self._remembered:
            self._remembered.add(optimizer)
            self._stateful[self._signature(optimizer)] = self._restores
        held = sum(len(group.get("params", ())) for group in optimizer.param_groups)
        for group in optimizer.param_groups:
            for param in group.get("params", ())[:VERSIONS_READ]:
                self._stepped_version[id(param)] = param._version
        known = self._without_grad.get(optimizer)
        if known is None or known[0] != held:  # new, or given a parameter group since
            known = (held, [p for group in optimizer.param_groups for p in group.get("params", ())])
        still = []
        for param in known[1]:
            if param.grad is None:
                still.append(param)
            else:
                self._had_grad.add(id(param))
        self._without_grad[optimizer] = (held, still)

    def _signature(self, optimizer: torch.optim.Optimizer) -> Signature:
        initial = self._initial.get(optimizer)
        if initial is None:  # built before instrumentation: its current rates stand in
            initial = self._initial[optimizer] = _initial_learning_rates(optimizer)
        return type(optimizer), optimizer_param_ids(optimizer), initial
