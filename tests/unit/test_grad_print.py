"""The private behaviour `producers.foreign_grads` relies on: a backward that accumulates
into an existing gradient bumps that tensor's version counter (``Tensor._version``), one
that finds no gradient sets a new tensor, and a backward that reaches no parameter of an
optimizer leaves its print alone."""

from __future__ import annotations

import torch
from torch import nn

from producers.foreign_grads import grad_print


def test_accumulating_backwards_change_the_print_and_others_do_not():
    layer, other = nn.Linear(3, 2), nn.Linear(3, 2)
    params = list(layer.parameters())
    empty = grad_print(params)
    assert empty == (None, None)
    layer(torch.randn(4, 3)).sum().backward()
    first = grad_print(params)
    assert None not in first and first != empty
    other(torch.randn(4, 3)).sum().backward()
    assert grad_print(params) == first
    layer(torch.randn(4, 3)).sum().backward()
    assert grad_print(params) != first
    layer.zero_grad(set_to_none=False)
    zeroed = grad_print(params)
    layer(torch.randn(4, 3)).sum().backward()
    assert grad_print(params) != zeroed
