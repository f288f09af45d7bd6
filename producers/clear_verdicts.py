"""The contract a gradient clear carries: whether it throws away gradients no optimizer used.

Two accounts decide it: `producers.wasted_grads` for optimizers that have stepped (a
clear between a backward and the step that would use it), and
`producers.unstepped_optimizers` for an optimizer none of whose parameters was ever
trained (a critic whose step was forgotten).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from invariants.events import MODULE_ZERO_GRAD, OPTIMIZER_ZERO_GRAD

from .grad_clears import cleared_inside_optimizer_update
from .wasted_grads import holds_unused_grads

if TYPE_CHECKING:
    from .tracer import Tracer

CLEARING_CONTRACTS = {OPTIMIZER_ZERO_GRAD: "clears_used_grads", MODULE_ZERO_GRAD: "module_clears_used_grads"}


def clearing_contract(tracer: "Tracer", api: str, extra: dict[str, Any],
                      optimizer: torch.optim.Optimizer | None) -> dict[str, bool] | None:
    """Whether a ``zero_grad`` clears gradients no optimizer used yet (`producers.wasted_grads`,
    and `producers.unstepped_optimizers` for an optimizer none of whose parameters was trained)."""
    if tracer.in_optimizer_step:
        return None
    cleared = [extra.get("obj")] if api == OPTIMIZER_ZERO_GRAD else extra.get("clears") or ()
    stepped = tracer.ownership.stepped_optimizers(cleared)
    used = tracer.contracts.wasted_grads.clears_used_grads(stepped, cleared_inside_optimizer_update)
    if used is None and optimizer is not None and not stepped and not cleared_inside_optimizer_update():
        never_trained = not any(tracer.ownership.is_trained(param) for group in optimizer.param_groups
                                for param in group.get("params", ()))
        used = tracer.contracts.unstepped.clears_used_grads(optimizer, never_trained, holds_unused_grads)
    return None if used is None else {CLEARING_CONTRACTS[api]: used}
