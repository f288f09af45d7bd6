"""Who holds a parameter, and whether it has been trained: the identity behind rules.

Rules about optimizers must speak of *which* optimizer: a ``zero_grad`` on one does not
clear another's gradients, and ``netD.zero_grad()`` (a ``Module.zero_grad`` over exactly
the parameters an optimizer holds) clears that optimizer's gradients as surely as
``optimizerD.zero_grad()`` does.  Rules about initialisation must speak of parameters
that hold learned values, trained in this run or loaded from a checkpoint by
``Module.load_state_dict``: re-initialising those is the bug, building a new model (or a
new head over a loaded backbone) and initialising it is not.

Optimizers are known by the index the `ParameterRegistry` gave them (``opt<i>``, in
order of first sight, so equal across ranks of one program).  Writes through
``param.data`` reach a tensor that is not the parameter object, so parameters are also
found by the address of their first element.
"""

from __future__ import annotations

import sys
import weakref
from typing import Callable, Iterable

import torch

from invariants.events import optimizer_id

from .digest import data_address, tensor_digests


def held_parameters(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The tensors an optimizer's parameter groups hold."""
    return [p for group in optimizer.param_groups for p in group.get("params", ()) if isinstance(p, torch.Tensor)]


def optimizer_param_ids(optimizer: torch.optim.Optimizer) -> frozenset[int]:
    return frozenset(id(p) for group in optimizer.param_groups for p in group.get("params", ()))


class ParameterOwnership:
    """Optimizer membership, trained and loaded parameters and ``.data`` aliases of one process."""

    def __init__(self) -> None:
        self._optimizers: dict[int, tuple[weakref.ref[torch.optim.Optimizer], frozenset[int]]] = {}
        self._trained: dict[int, weakref.ref[torch.Tensor]] = {}
        self._loaded: dict[int, weakref.ref[torch.Tensor]] = {}
        self._by_address: dict[int, weakref.ref[torch.Tensor]] = {}
        self.stepped: set[int] = set()
        self._untrained: dict[int, tuple[int, bool]] = {}  # id(model) -> (step asked, answer)
        self._input_optimizers: dict[int, weakref.ref[torch.optim.Optimizer]] = {}  # holding plain tensors
        #: moves whenever an optimizer's parameter set does (what ``optimized_parameters`` lists)
        self.holdings_changed = 0

    # -- parameters ------------------------------------------------------------------------
    def remember(self, param: torch.Tensor) -> None:
        """Know ``param`` by its address too (from the global registration hook at model
        build, and from every re-read of the model's names)."""
        address = data_address(param)
        if address is not None:
            self._by_address[address] = weakref.ref(param)

    def parameter_of(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """The parameter ``tensor`` is, or aliases through ``.data`` (same storage and shape)."""
        if isinstance(tensor, torch.nn.Parameter):
            return tensor
        address = data_address(tensor)
        ref = self._by_address.get(address) if address is not None else None
        param = ref() if ref is not None else None
        if param is not None and param.shape == tensor.shape and data_address(param) == address:
            return param
        return None

    # -- optimizers ----------------------------------------------------------------------
    def optimizer_seen(self, optimizer: torch.optim.Optimizer, index: int) -> None:
        """(Re)read an optimizer's parameters; param groups may be added after construction."""
        ids = optimizer_param_ids(optimizer)
        previous = self._optimizers.get(index)
        if previous is None or previous[1] != ids:
            self.holdings_changed += 1
        self._optimizers[index] = (weakref.ref(optimizer), ids)
        if any(not isinstance(p, torch.nn.Parameter) for group in optimizer.param_groups for p in group["params"]):
            self._input_optimizers[index] = weakref.ref(optimizer)

    def optimizes_inputs_of(self, model: torch.nn.Module) -> bool:
        """Whether the program optimises tensors that are no module's parameters (an image
        in style transfer, an adversarial perturbation) through ``model``, which no
        optimizer trains: its ``eval()`` mode then means a fixed function, not evaluation."""
        if not any(ref() is not None for ref in self._input_optimizers.values()):
            return False
        return not any(self.held_by_optimizer(param) for param in model.parameters())

    def optimizer_stepped(self, optimizer: torch.optim.Optimizer, index: int) -> None:
        """Its parameters count as trained from its first step on."""
        if index in self.stepped:
            return
        self.stepped.add(index)
        self.optimizer_seen(optimizer, index)
        self._mark_trained(p for group in optimizer.param_groups for p in group.get("params", ()))

    def cleared_by(self, module: torch.nn.Module) -> list[str]:
        """The optimizers whose gradients ``module.zero_grad()`` leaves empty: every
        parameter they hold is the module's or has no gradient (a loss-weighting module
        not in the graph yet, a second module an earlier clear already emptied), as for
        hand clears (`producers.grad_clears`)."""
        if not self._optimizers:
            return []
        held = {id(p) for p in module.parameters()}
        cleared = []
        for index, (ref, params) in sorted(self._optimizers.items()):
            optimizer = ref()
            if not params or optimizer is None or not params & held:
                continue
            if params <= held or all(p.grad is None for group in optimizer.param_groups
                                     for p in group.get("params", ()) if id(p) not in held):
                cleared.append(optimizer_id(index))
        return cleared

    def digests_held_alone(self, optimizer: torch.optim.Optimizer) -> dict[int, str]:
        """Data digests of the parameters ``optimizer`` holds and no other live optimizer
        does, by ``id`` (digests a device computes are read back at once)."""
        others = set()
        for ref, params in self._optimizers.values():
            other = ref()
            if other is not None and other is not optimizer:
                others |= params
        mine = [p for group in optimizer.param_groups for p in group.get("params", ())
                if isinstance(p, torch.Tensor) and id(p) not in others]
        return {id(p): digest for p, digest in zip(mine, tensor_digests(mine)) if isinstance(digest, str)}

    def several_optimizers(self) -> bool:
        """Whether the program has registered more than one optimizer (cheap: no walk)."""
        return len(self._optimizers) > 1

    def stepped_optimizers(self, names: Iterable[str]) -> list[torch.optim.Optimizer]:
        """The live optimizers among ``names`` (``opt<i>``) that have stepped before."""
        wanted = set(names)
        found = []
        for index, (ref, _) in sorted(self._optimizers.items()):
            optimizer = ref()
            if optimizer is not None and index in self.stepped and optimizer_id(index) in wanted:
                found.append(optimizer)
        return found

    def live_optimizers(self) -> list[tuple[str, list[torch.Tensor]]]:
        """``(opt<i>, its parameters)`` of every optimizer still alive."""
        alive = []
        for index, (ref, _) in sorted(self._optimizers.items()):
            optimizer = ref()
            if optimizer is not None:
                alive.append((optimizer_id(index), [p for group in optimizer.param_groups for p in group.get("params", ())]))
        return alive

    def held_elsewhere(self, optimizer: torch.optim.Optimizer) -> set[int]:
        """Ids of the parameters the live optimizers other than ``optimizer`` hold
        (wrappers sharing its ``param_groups`` are ``optimizer``)."""
        held: set[int] = set()
        for ref, ids in self._optimizers.values():
            other = ref()
            if other is not None and other is not optimizer and other.param_groups is not optimizer.param_groups:
                held |= ids
        return held

    def optimized_parameters(self) -> list[torch.Tensor]:
        """The parameters the live optimizers hold."""
        return [param for _, params in self.live_optimizers() for param in params]

    def known_parameters(self) -> list[torch.Tensor]:
        """Every parameter still alive that registration or training made known."""
        return [param for ref in self._by_address.values() if (param := ref()) is not None]

    def held_by_optimizer(self, param: torch.Tensor) -> bool:
        """Whether a live optimizer holds ``param`` (as its parameters were last read)."""
        key = id(param)
        return any(key in params and ref() is not None for ref, params in self._optimizers.values())

    def held_only_while_toggled_off(self, param: torch.Tensor) -> bool:
        """Whether the live optimizers holding ``param`` (at least one) all hold no
        parameter that takes gradients now: a network switched off as a whole for another
        one's update (a GAN's discriminator), not a part frozen inside a model whose
        optimizer trains the rest."""
        key = id(param)
        holders = [optimizer for ref, params in self._optimizers.values()
                   if key in params and (optimizer := ref()) is not None]
        return bool(holders) and not any(p.requires_grad for optimizer in holders
                                         for group in optimizer.param_groups for p in group.get("params", ()))

    @property
    def optimizer_known(self) -> bool:
        return bool(self._optimizers)

    def trains_none_of(self, module: torch.nn.Module) -> bool:
        """Whether ``module`` has parameters that take gradients and no optimizer of the
        program holds any of them (only asked where that is unusual: a submodule its
        model does not register).  False while no optimizer is known."""
        held = [params for ref, params in self._optimizers.values() if ref() is not None]
        if not held:
            return False
        trainable = [id(p) for p in module.parameters() if p.requires_grad]
        return bool(trainable) and not any(pid in params for pid in trainable for params in held)

    # -- trained parameters ----------------------------------------------------------------
    def loop_trained(self, params: Iterable[torch.Tensor]) -> None:
        """A loop without an optimizer trained these (its parameters that take gradients)."""
        self._mark_trained(p for p in params if p.requires_grad)

    def _mark_trained(self, params: Iterable[torch.Tensor]) -> None:
        _mark(self._trained, params, self.remember)

    def is_trained(self, param: torch.Tensor) -> bool:
        return _marked(self._trained, param)

    def untrained(self, model: torch.nn.Module, step: int) -> bool:
        """Whether no parameter of ``model`` has been trained in this run (an EMA teacher,
        a target network); asked for passes without gradients, answered once per step."""
        cached = self._untrained.get(id(model))
        if cached is not None and cached[0] == step:
            return cached[1]
        answer = not any(self.is_trained(param) for param in model.parameters())
        self._untrained[id(model)] = (step, answer)
        return answer

    # -- loaded parameters -----------------------------------------------------------------
    def loaded(self, params: Iterable[torch.Tensor]) -> None:
        """``Module.load_state_dict`` gave these values from a state dict."""
        _mark(self._loaded, params, self.remember)

    def holds_learned(self, param: torch.Tensor) -> bool:
        """Trained in this run, or loaded: values an initialiser would destroy."""
        return _marked(self._trained, param) or _marked(self._loaded, param)


def _mark(marks: dict[int, weakref.ref[torch.Tensor]], params: Iterable[torch.Tensor],
          remember: Callable[[torch.Tensor], None]) -> None:
    for param in params:
        ref = marks.get(id(param))
        if ref is None or ref() is not param:  # an id reused by a new tensor is a new parameter
            marks[id(param)] = weakref.ref(param)
            remember(param)


def _marked(marks: dict[int, weakref.ref[torch.Tensor]], param: torch.Tensor) -> bool:
    ref = marks.get(id(param))
    return ref is not None and ref() is param


#: how far up the stack a module's own ``reset_parameters`` may call an initialiser
_RESET_DEPTH = 6


def deliberate_reset() -> bool:
    """An initialiser called from a module's ``reset_parameters()``: the documented way to
    re-initialise a module on purpose (a new task head over a loaded checkpoint), unlike a
    model's ``init_weights`` walking every module again.  A loaded target counts as new;
    one trained in this run still holds what training learned."""
    frame = sys._getframe(2)
    for _ in range(_RESET_DEPTH):
        if frame is None:
            return False
        if frame.f_code.co_name == "reset_parameters":
            return True
        frame = frame.f_back
    return False
