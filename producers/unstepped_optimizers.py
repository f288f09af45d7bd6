"""An optimizer whose own loss is back-propagated again and again while it never steps.

A phase that adds a second network and forgets its ``step()`` (DeblurGANv2's WGAN phase
back-propagates both critics and never steps them) trains nothing of it: the critics stay
random, the generator learns against them, and the loss looks like a GAN's.  The
per-step accounting of `producers.wasted_grads` cannot see it: another optimizer's step
follows every backward, so no backward is left unused when the critics' clear comes.

So a clear of an optimizer none of whose parameters was ever trained (by any optimizer
or by hand) is judged on ``clears_used_grads`` too, once it is not its first: it breaks
when, since its previous clear, another optimizer stepped and a backward reached its
parameters and none another optimizer holds (a loss of its own: the critic's, on
detached fakes), and it still holds finite, non-zero gradients.  The generator's loss
reaching a critic that is not trained yet (a discriminator that starts later, cleared by
a loop over all optimizers), and a critic's loss reaching a generator that has not
stepped yet (SN-GAN's critic iterations on fakes not detached, clearing both), are no
losses of their own; a clear during setup, gradients that are zero
and a clear inside an optimizer's own update (sharpness-aware minimisation) are not
judged either.  The autograd graph of a backward is walked only
while such an optimizer waits, at most `MAX_NODES` nodes of it, and an optimizer that
went `QUIET_CLEARS` clears without a loss of its own is no longer waited for.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils.weak import WeakIdKeyDictionary

#: autograd nodes walked per backward to find the parameters it reaches
MAX_NODES = 20_000
#: clears, each after another optimizer's step, without a loss of the optimizer's own
#: before it is no longer watched (a discriminator that starts much later must not
#: have every backward's graph walked until it does)
QUIET_CLEARS = 8


class UnsteppedOptimizers:
    """Optimizers over parameters never trained that were cleared: the process's step
    count at their latest clear, and whether a loss of their own was back-propagated since."""

    def __init__(self) -> None:
        self._steps = 0
        self._cleared_at: WeakIdKeyDictionary[torch.optim.Optimizer, int] = WeakIdKeyDictionary()
        self._waiting: WeakIdKeyDictionary[torch.optim.Optimizer, bool] = WeakIdKeyDictionary()
        self._quiet: WeakIdKeyDictionary[torch.optim.Optimizer, int] = WeakIdKeyDictionary()

    def stepped(self, optimizer: torch.optim.Optimizer) -> None:
        """After ``optimizer``'s step: it trains now, so it is judged by
        `producers.wasted_grads` and no longer waited for here."""
        self._steps += 1
        self._waiting.pop(optimizer, None)
        self._cleared_at.pop(optimizer, None)

    def backward(self, roots: Any, held_elsewhere: Callable[[torch.optim.Optimizer], set[int]]) -> None:
        """Before a backward from ``roots`` (a tensor or a sequence of them);
        ``held_elsewhere(optimizer)``: ids of the parameters other optimizers hold."""
        if not self._waiting or all(self._waiting.values()):
            return
        reached = _reached_leaves(roots)
        if reached is None:
            return
        for optimizer, own in list(self._waiting.items()):
            if own or not any(id(param) in reached for group in optimizer.param_groups
                              for param in group.get("params", ())):
                continue
            if not held_elsewhere(optimizer).intersection(reached):
                self._waiting[optimizer] = True

    def clears_used_grads(self, optimizer: torch.optim.Optimizer, never_trained: bool,
                          wasted: Callable[[torch.optim.Optimizer], bool]) -> bool | None:
        """Judged at a clear of ``optimizer`` outside any update; None: not judged."""
        before = self._cleared_at.get(optimizer)
        own_loss = self._waiting.pop(optimizer, False)
        if not never_trained:
            self._cleared_at.pop(optimizer, None)
            return None
        self._cleared_at[optimizer] = self._steps
        if before is None or before == self._steps:
            self._waiting[optimizer] = False
            return None
        if not own_loss:
            quiet = self._quiet[optimizer] = self._quiet.get(optimizer, 0) + 1
            if quiet < QUIET_CLEARS:
                self._waiting[optimizer] = False
            return None
        self._waiting[optimizer] = False
        return False if wasted(optimizer) else None


def _reached_leaves(roots: Any) -> dict[int, torch.Tensor] | None:
    """The leaves requiring gradients that a backward from ``roots`` accumulates into, by
    id; None when the graph is larger than `MAX_NODES`."""
    tensors = [roots] if isinstance(roots, torch.Tensor) else [t for t in roots or () if isinstance(t, torch.Tensor)]
    pending = [t.grad_fn for t in tensors if t.grad_fn is not None]
    seen: set[int] = set()
    leaves: dict[int, torch.Tensor] = {}
    while pending:
        node = pending.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if len(seen) > MAX_NODES:
            return None
        variable = getattr(node, "variable", None)
        if variable is not None:
            leaves[id(variable)] = variable
        pending.extend(edge[0] for edge in node.next_functions)
    return leaves
