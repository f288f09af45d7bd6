"""An optimizer stepping on gradients that another optimizer's backward left in it.

With two networks and two optimizers (a GAN, an actor and its critic, a student and a
discriminator), the first network's loss often back-propagates through the second: the
generator's adversarial loss runs through the discriminator, DDPG's actor loss through
the critic.  That backward writes into the second network's ``.grad`` too.  Healthy loops
clear the second optimizer's gradients before its own backward, or switch its
parameters' ``requires_grad`` off for the first backward; a loop that clears only after
each step (Lightning issue 591's pattern, OmniTokenizer issue 15) makes the second
optimizer apply the first loss's gradient together with its own: the discriminator is
partly trained to score fakes as real, the critic towards the actor's objective.

So each optimizer step carries the contract ``steps_own_grads``: no backward of the
optimizer's cycle (`producers.loss_averaging`: the backwards since its previous step or
clear) that changed its gradients was followed by another optimizer's step and then by a
backward of the cycle's own.  A cycle whose every backward fed another optimizer's step
is not this mistake (one loss stepped by two optimizers, an optimizer stepped at a
slower rate than another over the same losses).  Nor is an inner loop of meta-learning:
an optimizer over deep copies of another optimizer's parameters (MAML, ProtoMAML) adapts
the copies, and gradients its losses send back to the originals (through prototypes
computed with them, or second-order terms) are the meta-gradient, on purpose.

Whether a backward changed an optimizer's gradients is read without touching values:
each gradient's identity and version counter (``Tensor._version``, which every in-place
accumulation bumps; relied on in ``tests/unit/test_grad_print.py``), compared with
what they were when the optimizer's cycle began.  Nothing is read while the program has
a single optimizer.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from .loss_averaging import LossFacts

GradPrint = tuple[tuple[int, int] | None, ...]


def grad_print(params: Sequence[torch.Tensor]) -> GradPrint:
    """Which gradient tensor each parameter holds, and how often it was written in place."""
    return tuple(None if p.grad is None else (id(p.grad), p.grad._version) for p in params)


class ForeignGrads:
    """Per optimizer: its gradients when its cycle began, and the latest backward that
    changed them before another optimizer stepped."""

    def __init__(self) -> None:
        self._at_cycle_start: dict[str, GradPrint] = {}
        self._restarted: set[str] = set()  # cycles begun by a step or clear: printed at the next backward
        self._fed_another: dict[str, int] = {}  # optimizer -> serial of that backward

    def cleared(self, optimizer_names: list[str]) -> None:
        for name in optimizer_names:
            self._restarted.add(name)
            self._fed_another.pop(name, None)

    @property
    def waiting(self) -> bool:
        """Whether a cycle begun since the last backward still needs its print."""
        return bool(self._restarted)

    def backward_begins(self, optimizers: list[tuple[str, list[torch.Tensor]]]) -> None:
        """Before a backward outside a step writes: print the cycles begun since the last
        one (after the step or clear that began them, which may write gradients too)."""
        for name, params in optimizers:
            if name in self._restarted:
                self._at_cycle_start[name] = grad_print(params)
        self._restarted.clear()

    def steps_own_grads(self, optimizer_name: str, cycle: Sequence[LossFacts], last_serial: int,
                        optimizers: list[tuple[str, list[torch.Tensor]]],
                        copied_from: Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], bool]) -> bool:
        """Judged at the step of ``optimizer_name`` over its cycle; ``last_serial`` is the
        latest backward's number, ``optimizers`` every live optimizer (only read when
        there are several), ``copied_from(copies, sources)`` whether some parameters are
        deep copies of others."""
        fed = self._fed_another.pop(optimizer_name, None)
        kept = not (fed is not None and cycle and cycle[0].serial <= fed < cycle[-1].serial)
        if len(optimizers) < 2:
            return kept
        self._restarted.add(optimizer_name)
        if not cycle:
            return kept
        stepping = next((params for name, params in optimizers if name == optimizer_name), [])
        for name, params in optimizers:
            if name == optimizer_name or name in self._restarted:
                continue
            start = self._at_cycle_start.get(name)
            if start is not None and start != grad_print(params) and not copied_from(stepping, params):
                self._fed_another[name] = last_serial
        return kept
