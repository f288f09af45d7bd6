"""Whether a backward pass keeps its graph for another backward over the same forward.

Multi-objective training that edits gradients (PCGrad's gradient surgery, MGDA, GradVac)
back-propagates each objective of one forward on its own: ``zero_grad``, ``backward(
retain_graph=True)``, copy the gradients, and again for the next objective, then writes
the combined gradients into ``p.grad`` and steps once.  The clears between those
backwards neither end the iteration nor throw away a micro-batch's gradients (they were
copied first), whereas the clear of an accumulation loop follows a backward that freed
its graph, because the next micro-batch runs a forward of its own.
"""

from __future__ import annotations

from typing import Any

#: positions of ``retain_graph`` and ``create_graph`` in ``Tensor.backward(self, gradient,
#: retain_graph, create_graph)`` and ``torch.autograd.backward(tensors, grad_tensors,
#: retain_graph, create_graph)``
_RETAIN_AT, _CREATE_AT = 2, 3


def keeps_graph(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """``retain_graph`` as the backward call resolves it (it defaults to ``create_graph``)."""
    retain = kwargs["retain_graph"] if "retain_graph" in kwargs else (
        args[_RETAIN_AT] if len(args) > _RETAIN_AT else None)
    if retain is None:
        retain = kwargs["create_graph"] if "create_graph" in kwargs else (
            args[_CREATE_AT] if len(args) > _CREATE_AT else False)
    return bool(retain)
