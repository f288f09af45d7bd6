"""Parameters frozen partway that their optimizer keeps moving.

Freezing a layer with ``requires_grad = False`` stops new gradients, not the optimizer.
Torch's optimizers skip a parameter only when its ``grad`` is None.  A loop that clears
with ``zero_grad(set_to_none=False)`` (the default before torch 2.0, still common in
code written for it) leaves the frozen layer a zero gradient, and the next step moves
it anyway: decoupled weight decay shrinks it, and Adam's moments or SGD's momentum
buffer, filled while it was training, keep pushing it along the old direction.  The
"frozen" backbone drifts for hundreds of steps; nothing errors.  A freeze that happens
after the backward and before the step moves it the same way.

So at each step every parameter the optimizer holds is classed: trainable, or frozen.
A parameter that this optimizer stepped while it was trainable and that is frozen now
breaks the contract when it still has a gradient and, at a non-zero learning rate, its
group decays weights, or that gradient or the momentum its optimizer state carries is
not all zero.  Reading those values waits for nothing on the CPU; on an accelerator it
would block the step, so there only weight decay is judged (the rest is reported as not
judged).  Parameters frozen from the start (a teacher, a
pretrained tower, master copies that hold gradients set by hand), frozen ones whose
gradient is None, and a new optimizer built over the still-trainable part are fine.

A gradient hook that returns zeros freezes nothing either (pytorch issue 38581: weight
decay does not respect hooks): a parameter with a hook whose gradient is all zero at a
step counts as frozen then (read on the CPU only), and is judged on weight decay alone
— a hook that masks part of a tensor (new token rows) leaves momentum moving the rows it
lets through, on purpose.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

#: optimizer-state entries that keep moving a parameter whose gradient is zero
MOMENTUM_STATES = ("exp_avg", "momentum_buffer")


def _decays(group: dict[str, Any]) -> bool:
    decay = group.get("weight_decay", 0)
    return type(decay) in (int, float) and decay > 0


def _learns(group: dict[str, Any]) -> bool:
    rate = group.get("lr", 0)
    return type(rate) not in (int, float) or rate != 0


def _any_nonzero(tensors: list[Any]) -> bool | None:
    """Whether one of the tensors holds a non-zero value; None when the answer lives on
    an accelerator (reading it would block the step)."""
    unknown = False
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor) or not tensor.numel():
            continue
        if not tensor.is_cpu or type(tensor) not in (torch.Tensor, torch.nn.Parameter):
            unknown = True  # a DTensor's any() would be a collective
        elif bool(tensor.any()):
            return True
    return None if unknown else False


def _pushes(param: torch.Tensor, state: Any) -> bool | None:
    """Whether a step will move a parameter that has a gradient through what it carries:
    the gradient itself, or a momentum filled while it trained."""
    carried = [state.get(key) for key in MOMENTUM_STATES] if isinstance(state, dict) else []
    return _any_nonzero([param.grad, *carried])


def _zeroed_by_hook(param: torch.Tensor) -> bool:
    """Whether a parameter with gradient hooks holds an all-zero gradient, read on the
    CPU only (elsewhere it counts as trainable: not judged)."""
    grad = param.grad
    return (grad is not None and grad.numel() > 0 and grad.is_cpu and type(grad) is torch.Tensor
            and not bool(grad.any()))


@dataclass
class _Held:
    """What an optimizer held at its previous step."""

    layout: tuple[tuple[int, int], ...]
    frozen: set[int]  # ids of the parameters frozen then
    frozen_after_training: set[int]  # of those, the ones it had stepped while trainable


def _layout(optimizer: torch.optim.Optimizer) -> tuple[tuple[int, int], ...]:
    """Which parameter lists the optimizer holds, and how long they are: unchanged, it
    holds the same parameters as before (lists are edited in place only by
    ``add_param_group``, which adds a group), so ids name the same tensors."""
    return tuple((id(group["params"]), len(group["params"])) for group in optimizer.param_groups)


class FrozenUpdates:
    """Per optimizer, its frozen parameters at its previous step and which of them it
    had stepped while they were trainable."""

    def __init__(self) -> None:
        self._held: "weakref.WeakKeyDictionary[torch.optim.Optimizer, _Held]" = weakref.WeakKeyDictionary()

    def keeps_frozen_weights(self, optimizer: torch.optim.Optimizer) -> bool | None:
        """Judged at each step but an optimizer's first: False when the step is about to
        move a parameter it trained that has been frozen since; None where a value that
        would decide it lives on an accelerator."""
        groups = optimizer.param_groups
        frozen = {id(param) for group in groups for param in group["params"]
                  if not param.requires_grad or (param._backward_hooks and _zeroed_by_hook(param))}
        layout = _layout(optimizer)
        before = self._held.get(optimizer)
        if before is None:
            self._held[optimizer] = _Held(layout, frozen, set())
            return None
        if layout == before.layout and frozen == before.frozen:
            after_training = before.frozen_after_training
        else:
            after_training = before.frozen_after_training & frozen
            if layout == before.layout:
                after_training |= frozen - before.frozen
            self._held[optimizer] = _Held(layout, frozen, after_training)
        if not after_training:
            return True
        return self._keeps(optimizer, [(param, group) for group in groups for param in group["params"]
                                       if id(param) in after_training])

    @staticmethod
    def _keeps(optimizer: torch.optim.Optimizer, watched: list[tuple[torch.Tensor, dict[str, Any]]]) -> bool | None:
        verdict: bool | None = True
        for param, group in watched:
            if param.grad is None or not _learns(group):
                continue
            if param.requires_grad:  # frozen by a hook: momentum may carry rows it lets through
                moved: bool | None = _decays(group)
            else:
                moved = True if _decays(group) else _pushes(param, optimizer.state.get(param))
            if moved:
                return False
            if moved is None:
                verdict = None
        return verdict
