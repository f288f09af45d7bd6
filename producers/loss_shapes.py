"""Hand-written losses that broadcast a ``(B, 1)`` prediction against a ``(B,)`` target.

``((pred - target) ** 2).mean()`` with a regression head's ``(B, 1)`` output and a
``(B,)`` target subtracts every target from every prediction: the difference is
``(B, B)``, the loss is finite and even falls a little (every prediction is pulled
towards the batch's mean target), and the head never learns the per-sample target
(pytorch#16045, pytorch#19699; the same shapes in a value loss against ``(B,)``
returns).  torch's own elementwise losses warn about it and are judged on their
arguments (`LossArguments`); a loss written by hand says nothing.

So each ``Tensor.backward`` of a scalar carries the contract ``compares_like_shapes``:
no subtraction near the loss's root (through arithmetic and reductions only, not into
the model) takes an operand of shape ``(B, 1)`` that the model produced and gives a
``(B, B)`` result, while its other operand is ``(B,)`` or a tensor without gradient
(a target).  An operand that was reshaped on purpose (``unsqueeze``, ``[:, None]``,
``view``) builds a pairwise matrix by intent (ranking and contrastive losses) and is
not judged.

The shapes come from the autograd graph: each node's ``_input_metadata`` gives the
shape of the tensor it produced.  That attribute is private; this module is the only
place that reads it, and a test covers it.
"""

from __future__ import annotations

from typing import Any

import torch

#: nodes a loss is computed with after the model's output: the walk goes through these only
_LOSS_ARITHMETIC = frozenset({
    "AddBackward0", "AddBackward1", "SubBackward0", "SubBackward1", "RsubBackward0", "RsubBackward1",
    "MulBackward0", "MulBackward1", "DivBackward0", "DivBackward1", "NegBackward0", "PowBackward0",
    "PowBackward1", "AbsBackward0", "SqrtBackward0", "MeanBackward0", "MeanBackward1", "SumBackward0",
    "SumBackward1", "ClampBackward1", "ClampMinBackward0", "ExpBackward0", "LogBackward0",
})
_SUBTRACTIONS = frozenset({"SubBackward0", "RsubBackward0"})
#: how an operand was reshaped on purpose to build a pairwise matrix
_RESHAPES = frozenset({
    "UnsqueezeBackward0", "ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0", "ExpandBackward0",
    "IndexBackward0", "SliceBackward0", "SelectBackward0", "AsStridedBackward0", "TransposeBackward0",
    "PermuteBackward0", "TBackward0",
})
#: nodes visited per backward at most: the loss's own arithmetic is a handful
_MAX_NODES = 48


def produced_shape(node: Any, output_nr: int) -> tuple[int, ...] | None:
    """The shape of output ``output_nr`` of autograd node ``node`` (None: unknown)."""
    try:
        return tuple(node._input_metadata[output_nr].shape)
    except (AttributeError, IndexError, TypeError, RuntimeError):
        return None


def _pairs_a_column_with_a_vector(node: Any) -> bool:
    out = produced_shape(node, 0)
    if out is None or len(out) != 2 or out[0] != out[1] or out[0] < 2:
        return False
    batch = out[0]
    operands = [(edge[0], edge[1]) for edge in node.next_functions]
    if len(operands) != 2:
        return False
    shapes = [None if operand is None else produced_shape(operand, nr) for operand, nr in operands]
    for index, (operand, _) in enumerate(operands):
        other, other_shape = operands[1 - index][0], shapes[1 - index]
        if (operand is not None and shapes[index] == (batch, 1) and type(operand).__name__ not in _RESHAPES
                and (other is None or other_shape == (batch,))):
            return True
    return False


def compares_like_shapes(loss: Any) -> bool | None:
    """Judged before ``loss.backward()`` (None: not a scalar loss with a graph)."""
    if not isinstance(loss, torch.Tensor) or loss.grad_fn is None or loss.numel() != 1:
        return None
    pending, seen = [loss.grad_fn], set()
    while pending and len(seen) < _MAX_NODES:
        node = pending.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        name = type(node).__name__
        if name not in _LOSS_ARITHMETIC:
            continue
        if name in _SUBTRACTIONS and _pairs_a_column_with_a_vector(node):
            return False
        pending.extend(edge[0] for edge in node.next_functions)
    return True
