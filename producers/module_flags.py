"""Modules "frozen" by an attribute: ``module.requires_grad = False``.

``requires_grad`` is a flag of tensors.  On an ``nn.Module`` the assignment only creates a
Python attribute: the module's parameters keep ``requires_grad=True``, still receive
gradients and are still updated by the optimizer that holds them, while the code reads as
a freeze (ProtoContra-SFDA#18: the prototype layer of a source-free adaptation keeps
training; the PyTorch forums answer this weekly).  ``module.requires_grad_(False)`` is the
method that freezes.

So every optimizer step carries ``freezes_through_parameters``: no parameter it updates
(one with a gradient) belongs to a module whose own ``requires_grad`` attribute is a bool
its parameters do not follow.  A module is looked at in its forwards only when it has
such an attribute (one dictionary lookup per forward otherwise).
"""

from __future__ import annotations

import weakref

import torch


class ModuleFlags:
    """Modules whose ``requires_grad`` attribute disagrees with their parameters."""

    def __init__(self) -> None:
        self._disagreeing: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()

    def forward(self, module: torch.nn.Module) -> None:
        """A forward of ``module``, which has an instance attribute ``requires_grad``."""
        flag = module.__dict__.get("requires_grad")
        if flag.__class__ is bool and any(param.requires_grad != flag for param in module.parameters()):
            self._disagreeing.add(module)
        else:
            self._disagreeing.discard(module)

    def freezes_through_parameters(self, optimizer: torch.optim.Optimizer) -> bool:
        """Judged before every step of ``optimizer``."""
        if not self._disagreeing:
            return True
        stepped = {id(param) for group in optimizer.param_groups for param in group.get("params", ())
                   if isinstance(param, torch.Tensor) and param.grad is not None}
        return not any(id(param) in stepped for module in list(self._disagreeing) for param in module.parameters())
