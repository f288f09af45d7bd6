"""Which module's training flag says what the program is doing.

A wrapper's own ``training`` flag can be stale: a DDP wrapper put in ``eval()`` by a
validation loop that switched only the module inside back to ``train()`` keeps
``training=False`` while the model it wraps trains.  The stage follows the model that
actually runs, found by unwrapping the usual wrappers: data-parallel (``.module``),
compiled (``._orig_mod``) and trainer-framework wrappers (``._forward_module``).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Iterator

import torch

if TYPE_CHECKING:
    from .contract_facts import ContractFacts
    from .ownership import ParameterOwnership
    from .params import ParameterRegistry
    from .recorder import StepRecorder

_WRAPPED_ATTRIBUTES = ("_orig_mod", "_forward_module")
_MAX_WRAPPERS = 4


def _data_parallel_types() -> tuple[type, ...]:
    from torch.nn.parallel import DataParallel, DistributedDataParallel

    return (DistributedDataParallel, DataParallel)


def wrapper_chain(module: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``module``, then each module its wrappers hold, outermost first
    (``torch.compile``'s ``_orig_mod``, Lightning's ``_forward_module``, DDP's ``module``)."""
    yield module
    for _ in range(_MAX_WRAPPERS):
        inner = None
        if isinstance(module, _data_parallel_types()):
            inner = module.module
        else:
            modules = module.__dict__.get("_modules")  # a scripted module's has no ``get``
            for attribute in _WRAPPED_ATTRIBUTES:
                try:
                    candidate = modules[attribute] if modules is not None else None
                except (KeyError, RuntimeError):
                    candidate = None
                if isinstance(candidate, torch.nn.Module):
                    inner = candidate
                    break
        if inner is None:
            return
        module = inner
        yield module


def real_model(module: torch.nn.Module) -> torch.nn.Module:
    """The model inside ``module``'s wrappers (``module`` itself when it wraps nothing)."""
    for module in wrapper_chain(module):
        pass
    return module


def holds_model(module: torch.nn.Module, roots: list[torch.nn.Module]) -> bool:
    """``module`` is a model root, contains one, or is the model inside one's wrappers.

    Switching such a module to ``train()``/``eval()`` changes what the program does;
    switching a submodule (a frozen BatchNorm in a fine-tuned backbone) does not.
    """
    for root in roots:
        if module is root or module is real_model(root):
            return True
    for child in module.modules():
        if any(child is root for root in roots):
            return True
    return False


#: the stage of a loop that optimises inputs through a fixed model (style transfer,
#: adversarial examples): neither training the model nor evaluating it
OPTIMIZING_INPUTS = "inputs"


def stage_of(model: torch.nn.Module, roots: list[torch.nn.Module],
             optimizes_inputs_of: Callable[[torch.nn.Module], bool] | None = None) -> str:
    """The stage a model's mode implies, given the other models of the process.

    A model in eval mode means evaluation only if no other model is training: a frozen
    teacher run by a distillation loop, or a generator switched to eval to draw samples
    while its discriminator trains, is used *by* training.  A model that is training is
    one whose mode is ``train`` and that has parameters taking gradients.  Nor is it
    evaluation when the program optimises plain tensors through a model no optimizer
    trains (``optimizes_inputs_of``): backward passes and steps are that loop's own."""
    model = real_model(model)
    if model.training:
        return "train"
    for root in roots:
        other = real_model(root)
        if other is not model and other.training and any(p.requires_grad for p in other.parameters()):
            return "train"
    if optimizes_inputs_of is not None and optimizes_inputs_of(model):
        return OPTIMIZING_INPUTS
    return "eval"


class StageSwitching:
    """The stage of a `Tracer` (a mixin): explicit annotations win over ``train()``/``eval()``."""

    stage: str
    _explicit_stages: list[str]
    _tail_start: int | None
    recorder: "StepRecorder"
    registry: "ParameterRegistry"
    ownership: "ParameterOwnership"
    contracts: "ContractFacts"

    @contextmanager
    def explicit_stage(self, name: str) -> Iterator[None]:
        """A user-annotated stage wins over the automatic one until the block ends."""
        previous = self.stage
        self._explicit_stages.append(name)
        self.stage = name
        try:
            yield
        finally:
            self._explicit_stages.pop()
            self.stage = self._explicit_stages[-1] if self._explicit_stages else previous

    def _set_auto_stage(self, stage: str) -> None:
        if self._explicit_stages:
            return
        if stage == "eval" and self.stage == "train" and self._tail_start is not None:
            # What ran since the last iteration ended (a test function re-seeding before
            # it calls ``model.eval()``) belongs to the evaluation, not to training.
            self.recorder.relabel_stage(self._tail_start, "train", "eval")
        if stage == "eval" and self.stage != "eval":
            self.contracts.eval_weights.evaluated()
        if stage == "train" and self.stage == "eval":
            self.contracts.epoch_schedules.epoch_boundary()  # training resumed after an evaluation
        self.stage = stage

    def mode_switched(self, module: torch.nn.Module) -> None:
        """After ``train()``/``eval()``: a model switched changes the stage at once."""
        if self.stage == "init" or not isinstance(module, torch.nn.Module):
            return  # setup keeps its stage until the first forward
        if holds_model(module, self.registry.roots()):
            self._set_auto_stage(stage_of(module, self.registry.roots(), self.ownership.optimizes_inputs_of))
