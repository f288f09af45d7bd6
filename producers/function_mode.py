"""Recording selected torch functions through a ``TorchFunctionMode``.

Functions no wrapper or hook covers (named by an invariants file, or every one with
``--full``) are recorded by a mode: torch calls it for every function, so the mode is
installed only when something needs it, and everything not selected returns after one
set lookup.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from torch.overrides import TorchFunctionMode, resolve_name

from .tracer import Tracer


def resolve_object(path: str) -> Any:
    """Import ``a.b.C`` as the longest importable module prefix plus attributes."""
    parts = path.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attr in parts[split:]:
            target = getattr(target, attr)
        return target
    raise ImportError(path)


class RecordingMode(TorchFunctionMode):
    """Records torch function calls; everything not selected returns after one set lookup."""

    def __init__(self, tracer: Tracer, selected: frozenset[Any] | None, wrapped: frozenset[Any]) -> None:
        super().__init__()
        self._tracer = tracer
        self._selected = selected  # None = every torch function (--full)
        self._skip = wrapped  # recorded by their wrappers already
        self._names: dict[Any, str] = {}

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        tracer = self._tracer
        if (
            (self._selected is not None and func not in self._selected)
            or not tracer.enabled
            or tracer.busy
            or func in self._skip
        ):
            return func(*args, **kwargs)
        name = self._names.get(func)
        if name is None:
            name = resolve_name(func) or f"{getattr(func, '__module__', 'torch')}.{getattr(func, '__qualname__', repr(func))}"
            self._names[func] = name
        call_args = {str(i): value for i, value in enumerate(args[:4])}
        call_args.update({k: v for k, v in kwargs.items() if not isinstance(v, (list, tuple))})
        token = tracer.begin_call(name, name, call_args)
        try:
            result = func(*args, **kwargs)
        except BaseException as exc:
            tracer.end_call(token, exc=exc)
            raise
        tracer.end_call(token, result)
        return result


def safe_resolve(path: str) -> Any:
    try:
        return resolve_object(path)
    except (ImportError, AttributeError):
        return None


class ModeHandle:
    def __init__(self, mode: TorchFunctionMode) -> None:
        self._mode: TorchFunctionMode | None = mode

    def remove(self) -> None:
        mode, self._mode = self._mode, None
        if mode is not None:
            try:
                mode.__exit__(None, None, None)
            except Exception:  # user code left modes unbalanced: nothing left to undo
                pass


def mode_target(api: str) -> Any:
    """The torch function a ``TorchFunctionMode`` records as ``api``, or None."""
    if not api.startswith("torch.") or "." not in api:
        return None
    owner = safe_resolve(api.rsplit(".", 1)[0])
    if isinstance(owner, type) and owner is not torch.Tensor:
        return None
    target = safe_resolve(api)
    return target if callable(target) and not isinstance(target, type) else None
