"""Value summaries for call arguments and results: small, msgpack-ready, never whole tensors.

The contract (invariants/events.py) allows scalars, short lists and dicts tagged with
``"T"``.  Summaries must be cheap enough to build on every recorded call, so nothing
here walks large containers or synchronises a device: only CPU scalar tensors carry
their ``value`` (that is how the loss reaches the checkers).
"""

from __future__ import annotations

import enum
from typing import Any, Callable

import torch

from .probabilities import is_probabilities

MAX_LIST = 8
MAX_STR = 200
MAX_DEPTH = 2

#: Optional lookup from ``id(tensor)`` to a parameter name, supplied by the session so
#: that e.g. ``nn.init.normal_`` events say *which* parameter was re-initialised.
NameLookup = Callable[[torch.Tensor], "str | None"]


_DTYPE_NAMES: dict[torch.dtype, str] = {}
_DEVICES: dict[torch.device, str] = {}


def tensor_layout(tensor: torch.Tensor) -> tuple[tuple[int, ...], str, int]:
    """(shape, dtype name, numel); dtype names are memoised (``str(dtype)`` is slow)."""
    dtype = tensor.dtype
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES.setdefault(dtype, str(dtype).removeprefix("torch."))
    return tuple(tensor.shape), name, tensor.numel()


def device_name(device: torch.device) -> str:
    name = _DEVICES.get(device)
    if name is None:
        name = _DEVICES.setdefault(device, str(device))
    return name


def summarize_tensor(tensor: torch.Tensor, name_of: NameLookup | None = None) -> dict[str, Any]:
    shape, dtype, numel = tensor_layout(tensor)
    device = tensor.device
    summary: dict[str, Any] = {
        "T": "tensor",
        "shape": list(shape),
        "dtype": dtype,
        "device": device_name(device),
        "requires_grad": tensor.requires_grad,
    }
    if type(tensor) is torch.nn.Parameter:
        summary["param"] = True
    elif is_probabilities(tensor):
        summary["probs"] = True  # a softmax's or sigmoid's output, e.g. reaching a loss
    if name_of is not None:
        name = name_of(tensor)
        if name is not None:
            summary["name"] = name
    if numel == 1 and device.type == "cpu":
        try:
            summary["value"] = tensor.item()  # a third of the time of detach().reshape(()).item()
        except (RuntimeError, ValueError):  # fake/functional tensors have no value
            pass
    return summary


def summarize(value: Any, name_of: NameLookup | None = None, depth: int = 0) -> Any:
    """Summarise any Python value into something msgpack can carry and checkers compare."""
    if value is None or isinstance(value, (bool, int, float)):
        if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
            return {"T": "int", "digits": len(str(value))}
        return value
    if isinstance(value, str):
        return value if len(value) <= MAX_STR else value[:MAX_STR] + "…"
    if isinstance(value, torch.Tensor):
        return summarize_tensor(value, name_of)
    if isinstance(value, (torch.dtype, torch.device)):
        return str(value)
    if isinstance(value, torch.nn.Module):
        return {"T": "module", "type": type(value).__name__}
    if isinstance(value, torch.optim.Optimizer):
        return summarize_optimizer(value)
    if isinstance(value, (list, tuple)):
        if depth >= MAX_DEPTH or len(value) > MAX_LIST:
            return {"T": type(value).__name__, "len": len(value)}
        return [summarize(item, name_of, depth + 1) for item in value]
    if isinstance(value, dict):
        keys = [str(key) for key in list(value)[:MAX_LIST]]
        return {"T": "dict", "len": len(value), "keys": keys}
    if isinstance(value, (bytes, bytearray)):
        return {"T": "bytes", "len": len(value)}
    if hasattr(value, "__fspath__"):
        return str(value)
    summary: dict[str, Any] = {"T": "obj", "type": type(value).__qualname__}
    member = _enum_member(value)
    if member is not None:
        summary["value"] = member  # e.g. which ReduceOp a collective was given
    return summary


def _enum_member(value: Any) -> str | None:
    """The member name of a Python or pybind11 enum (``ReduceOp.MAX`` -> ``"MAX"``)."""
    if isinstance(value, enum.Enum) or hasattr(type(value), "__members__"):
        name = getattr(value, "name", None)
        return name if isinstance(name, str) else None
    return None


def summarize_optimizer(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    groups = optimizer.param_groups
    summary: dict[str, Any] = {"T": "optimizer", "type": type(optimizer).__name__, "groups": len(groups)}
    lrs = []
    for group in groups[:MAX_LIST]:
        lr = group.get("lr")
        lrs.append(float(lr) if isinstance(lr, (int, float)) else summarize(lr))
    summary["lr"] = lrs
    return summary
