"""The per-thread state of a `Tracer`, the token of a call it opened, and the closure
an optimizer step was given.

Kept apart from the tracer so that the modules of its mixins (step boundaries, forward
hooks) can name them without importing the tracer.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

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
