"""Gradients cleared by hand: ``p.grad = None`` and ``p.grad.zero_()`` outside any
``zero_grad`` API.

Loops written without ``torch.optim`` (tutorials, d2l-style ``sgd`` helpers,
hand-written updates) and "faster zero_grad" recipes clear gradients one parameter at
a time.  That is the same fact as a ``zero_grad``: without it, "gradients are cleared
before each backward" fires on every such healthy loop, and the iteration such a clear
ends goes unseen.  So a hand clear is

* a loop signal at once (after a backward it ends the iteration, as ``zero_grad`` does),
  except between a backward and the optimizer step that uses it: there clearing some
  parameters' gradients freezes them for that step (DINO's last layer in its first
  epoch), and only a clear that empties an optimizer's every gradient skips the step
  and ends the iteration;
* one ``torch.Tensor.grad_clear`` call per iteration, recorded just before the next
  backward or optimizer step, when it is known which optimizers it cleared entirely:
  ``clears`` lists those whose every parameter had its gradient cleared or has none.

Writes made by an optimizer's own ``zero_grad``, inside a step, or by autograd during a
backward are not hand clears and are not seen here.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterable

import torch

if TYPE_CHECKING:
    from .tracer import Tracer

TORCH_VERSION = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])

#: groups of wrapped calls inside which a gradient write is that call's own business
_OWNING_GROUPS = frozenset({"zero_grad", "backward"})


class HandClears:
    """Parameters whose gradients user code cleared since the last backward or step."""

    def __init__(self) -> None:
        self._cleared: dict[int, torch.Tensor] = {}
        #: grad tensor address -> its parameter, rebuilt lazily after each backward
        self._grad_owners: dict[int, torch.Tensor] | None = None
        #: per optimizer, how many of its gradients are still there; which optimizers hold
        #: each of those parameters; the optimizers the clears reached (built at the
        #: first clear that asks)
        self._uncleared: dict[str, int] | None = None
        self._holders: dict[int, list[str]] = {}
        self._reached: set[str] = set()

    def backward_ran(self) -> None:
        self._grad_owners = None

    def note(self, param: torch.Tensor) -> bool:
        """Remember a cleared parameter; True for the first clear since the last flush."""
        first = not self._cleared
        self._cleared[id(param)] = param
        return first

    def empties_an_optimizer(self, param: torch.Tensor,
                             optimizers: Callable[[], Iterable[tuple[str, list[torch.Tensor]]]]) -> bool:
        """Whether the clears since the last backward (``param``'s included, already
        noted) took away every gradient of an optimizer they reached; ``optimizers`` is
        called once per batch of clears.  An optimizer the clears never touched (one
        whose turn to backward has not come in this iteration) is not emptied by them."""
        if self._uncleared is None:
            self._uncleared, self._holders, self._reached = {}, {}, set()
            for name, params in optimizers():
                remaining = 0
                for p in params:
                    if id(p) in self._cleared:
                        self._reached.add(name)
                    elif p.grad is not None:
                        remaining += 1
                        self._holders.setdefault(id(p), []).append(name)
                self._uncleared[name] = remaining
        else:
            for name in self._holders.pop(id(param), ()):
                self._uncleared[name] -= 1
                self._reached.add(name)
        return any(self._uncleared[name] == 0 for name in self._reached)

    def param_of_grad(self, tensor: torch.Tensor, params: Callable[[], Iterable[torch.Tensor]]) -> torch.Tensor | None:
        """The parameter whose ``.grad`` ``tensor`` is (or views through ``.data``);
        ``params`` is called only when the map is rebuilt (once after each backward)."""
        if not tensor.numel() or tensor.device.type == "meta":
            return None
        if self._grad_owners is None:
            self._grad_owners = {}
            for param in params():
                grad = param.grad
                if grad is not None and grad.numel():
                    self._grad_owners[grad.data_ptr()] = param
        param = self._grad_owners.get(tensor.data_ptr())
        if param is None or param.grad is None or param.grad.shape != tensor.shape:
            return None
        return param

    def take(self, optimizers: Iterable[tuple[str, list[torch.Tensor]]]) -> list[str] | None:
        """The optimizers cleared entirely (None: nothing was cleared by hand)."""
        if not self._cleared:
            return None
        cleared = self._cleared
        self._cleared = {}
        self._uncleared, self._holders, self._reached = None, {}, set()
        return [
            name for name, params in optimizers
            if params and all(id(p) in cleared or p.grad is None for p in params)
        ]


def cleared_inside_optimizer_update() -> bool:
    """Whether the code clearing gradients is a method of an optimizer other than its
    ``zero_grad``: sharpness-aware minimisation's ``first_step`` perturbs the weights and
    clears the gradients for a second backward pass of the same iteration.  A loop's own
    clear, or a wrapper optimizer's ``zero_grad`` handing on to the one it wraps, is
    called from elsewhere."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] == "producers":
        frame = frame.f_back
    if frame is None or frame.f_code.co_name == "zero_grad":
        return False
    return isinstance(frame.f_locals.get("self"), torch.optim.Optimizer)


def hand_clear_allowed(tracer: "Tracer") -> bool:
    return (tracer.enabled and not tracer.busy and not tracer.in_optimizer_step
            and not (_OWNING_GROUPS & tracer.thread_groups) and not torch.compiler.is_compiling())


def load_dynamo_before_grad_is_replaced() -> None:
    """Import ``torch._dynamo`` before ``Tensor.grad`` becomes our property.

    Importing dynamo walks torch's override tables and, before torch 2.13, assumes the
    ``__get__`` of every Tensor attribute found there belongs to one of torch's own
    descriptors (it reads ``__objclass__``, which a Python property lacks).  Most programs
    import dynamo lazily when their first optimizer is built, so with ``Tensor.grad``
    already replaced that construction would raise.  Imported first, dynamo only ever
    sees torch's descriptor.  From 2.13 on dynamo checks for the attribute, and nothing
    is imported early (DataLoader workers and evaluation jobs never need dynamo).
    """
    if TORCH_VERSION >= (2, 13):
        return
    try:
        importlib.import_module("torch._dynamo")
    except Exception:  # a build without dynamo cannot trip over our property either
        pass


def grad_property(tracer: "Tracer", descriptor: Any) -> property:
    """``Tensor.grad`` with a setter that notices ``param.grad = None``; reads and other
    writes go straight to torch's own descriptor."""

    def set_grad(tensor: torch.Tensor, value: Any) -> None:
        descriptor.__set__(tensor, value)
        if value is None and isinstance(tensor, torch.nn.Parameter) and hand_clear_allowed(tracer):
            try:
                tracer.grad_cleared_by_hand(tensor)
            except Exception as exc:
                tracer.internal_error("gradient clear", exc)

    # reads (every optimizer step reads each parameter's .grad) call torch's descriptor
    # directly: no Python frame of ours on that path
    return property(descriptor.__get__, set_grad, descriptor.__delete__, getattr(descriptor, "__doc__", None))
