"""The per-thread state of a `Tracer`, the token of a call it opened, the closure an
optimizer step was given, and which optimizer steps run inside another's.

Kept apart from the tracer so that the modules of its mixins (step boundaries, forward
hooks) can name them without importing the tracer.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

import torch


class ThreadState(threading.local):
    """Per-thread bookkeeping; a fresh instance appears in every thread."""

    def __init__(self) -> None:
        self.stack: list[int] = []  # cids of recorded calls in progress
        self.groups: set[str] = set()  # wrapper groups in progress (suppress nesting)
        self.busy = False  # the tracer itself is running torch code
        self.depth = 0  # module forward nesting depth
        self.forward_cids: list[int | None] = []
        self.root_paths: dict[int, str] = {}
        self.root_obj: str | None = None  # ``m<i>`` of the model the current forward runs in
        self.checkpointed = 0  # reentrant checkpoint blocks in progress (gradients come later)
        self.root_grad = False  # whether the outermost module forward in progress began with gradients
        self.cut_checkpointed = 0  # reentrant checkpoint blocks of such a forward that no gradient will reach

    @contextlib.contextmanager
    def own_work(self) -> Iterator[None]:
        """The tracer's own torch work runs inside (nothing recorded); regions nest, so the
        flag a region found comes back after it."""
        was, self.busy = self.busy, True
        try:
            yield
        finally:
            self.busy = was


class CallToken:
    """What a wrapper needs to close the call it opened."""

    __slots__ = ("cid", "api", "name", "snapshot_of", "restore_stage", "group", "pre_attrs", "post_attrs")

    def __init__(self, cid: int, api: str, name: str) -> None:
        self.cid = cid
        self.api = api
        self.name = name
        self.snapshot_of: torch.optim.Optimizer | None = None
        self.restore_stage: str | None = None
        self.group: str | None = None
        self.pre_attrs: list[tuple[Any, dict[str, Any]]] | None = None
        self.post_attrs: list[tuple[Any, dict[str, Any]]] | None = None


def closure_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Callable[..., Any] | None, bool]:
    """The closure passed to ``step`` and whether it came by keyword (``args[0]`` is the optimizer)."""
    closure = kwargs.get("closure")
    if callable(closure):
        return closure, True
    if len(args) > 1 and callable(args[1]):
        return args[1], False
    return None, False


class InnerSteps:
    """Optimizers stepped from inside another optimizer's own step (ZeroRedundancyOptimizer's
    local optimizer, a Lookahead's or SAM's base): part of the outer step, whose end comes
    after what the outer step does next (ZeRO broadcasts the updated shards).  A step made
    inside a step's closure (a critic stepped in the generator's closure) is the user's own."""

    def __init__(self) -> None:
        self._inner: set[int] = set()
        self.in_closures = 0  # step closures running

    def begins(self, optimizer: Any, stepping: set[int]) -> bool:
        """At a step's start, with the optimizers inside their step: True for an inner step."""
        if stepping and id(optimizer) not in stepping and not self.in_closures:
            self._inner.add(id(optimizer))
            return True
        return False

    def ends(self, optimizer: Any) -> bool:
        """At a step's end: True for an inner step's."""
        if id(optimizer) not in self._inner:
            return False
        self._inner.discard(id(optimizer))
        return True

    def outer_ended(self) -> None:
        """No step is under way: an inner step that raised never reached its end."""
        self._inner.clear()
