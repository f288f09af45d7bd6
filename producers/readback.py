"""Snapshot results computed on an accelerator, read back later instead of at once.

Reading a value computed on an accelerator (``.tolist()``, ``.item()``) waits for every
kernel queued before it.  A snapshot that read its norms and digests at once would
drain the device queue several times per step: the host stops running ahead, and the
device idles while the host queues the next kernels.  Instead, the norms and digest
words of one snapshot are gathered per device into one int64 tensor, copied without
blocking into pinned host memory, and an event is recorded behind the copy.  The
recorder turns them into values at a later step boundary (`StepRecorder`), when the
copy has usually landed; if not, waiting for that one event still lets the device
keep the queued step's work.

Values are bitwise those of an immediate read: norms travel as the bit patterns of
float64, which holds every float32/float16/bfloat16 value exactly.  CPU tensors are
summarised at once as before (reading host memory waits for nothing).
"""

from __future__ import annotations

import os
from typing import Any, Protocol, Sequence

import torch

from .digest import format_digest_words

#: Tests only: CPU tensors take the deferred device path (device digests, an event
#: that is always ready), so that the deferral is exercised on machines without one.
FORCE_DEFERRED = False
#: Read accelerator results at once, as before deferral (for comparisons).
IMMEDIATE = os.environ.get("TRAINWATCH_IMMEDIATE_READBACK") == "1"

_pinning_works: bool | None = None


class _Event(Protocol):
    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class _Landed:
    """The event of a copy that has already happened (CPU, or a failed event)."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


def defers(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s summaries are computed by the device path and read back later."""
    return FORCE_DEFERRED or not tensor.is_cpu


class Deferred:
    """One value of a `Readback`, known once the readback is resolved."""

    __slots__ = ("readback", "index")

    def __init__(self, readback: "Readback", index: int) -> None:
        self.readback = readback
        self.index = index

    def put(self, attrs: dict[str, Any], key: str) -> None:
        """``attrs[key]`` = the value: now if known, else ``None`` until resolution fills it."""
        self.readback.fill(attrs, key, self.index)


class Readback:
    """The device results of one snapshot, on their way to the host."""

    def __init__(self) -> None:
        self._parts: dict[torch.device, list[torch.Tensor]] = {}
        # per device: (offset in its buffer, count, first value index, headers or None for norms)
        self._layout: dict[torch.device, list[tuple[int, int, int, list[bytes] | None]]] = {}
        self._sizes: dict[torch.device, int] = {}
        self._copies: list[tuple[torch.Tensor, _Event, list[tuple[int, int, int, list[bytes] | None]]]] = []
        self._values: list[Any] = []
        self._targets: list[tuple[dict[str, Any], str, int]] = []
        self.resolved = False

    def _add(self, words: torch.Tensor, count: int, headers: list[bytes] | None) -> list[Deferred]:
        device = words.device
        first = len(self._values)
        self._values.extend([None] * count)
        offset = self._sizes.get(device, 0)
        self._parts.setdefault(device, []).append(words.reshape(-1))
        self._layout.setdefault(device, []).append((offset, count, first, headers))
        self._sizes[device] = offset + words.numel()
        return [Deferred(self, first + i) for i in range(count)]

    def norms(self, norms: torch.Tensor) -> list[Deferred]:
        """Deferred floats for a 1-D tensor of norms on one device."""
        return self._add(norms.to(torch.float64).view(torch.int64), norms.numel(), None)

    def digests(self, words: torch.Tensor, headers: Sequence[bytes]) -> list[Deferred]:
        """Deferred digest strings for an (n, 2) int64 tensor of device words and their headers."""
        return self._add(words, len(headers), list(headers))

    def start(self) -> bool:
        """Launch one copy per device; False when there was nothing to read back."""
        for device, parts in self._parts.items():
            flat = parts[0] if len(parts) == 1 else torch.cat(parts)
            host, event = _copy_to_host(flat)
            self._copies.append((host, event, self._layout[device]))
        self._parts.clear()
        if not self._copies:
            self.resolved = True
        return not self.resolved

    def ready(self) -> bool:
        return self.resolved or all(event.query() for _, event, _ in self._copies)

    def resolve(self) -> None:
        """Wait for the copies if they have not landed, then fill every registered target."""
        if self.resolved:
            return
        try:
            for host, event, layout in self._copies:
                if not event.query():
                    event.synchronize()
                for offset, count, first, headers in layout:
                    if headers is None:
                        values: list[Any] = host[offset : offset + count].view(torch.float64).tolist()
                    else:
                        words = host[offset : offset + 2 * count].tolist()
                        values = [format_digest_words(h, words[2 * i : 2 * i + 2]) for i, h in enumerate(headers)]
                    self._values[first : first + count] = values
        finally:  # a failed read leaves its values None rather than pending forever
            self._copies.clear()
            self.resolved = True
            for attrs, key, index in self._targets:
                attrs[key] = self._values[index]
            self._targets.clear()

    def fill(self, attrs: dict[str, Any], key: str, index: int) -> None:
        if self.resolved:
            attrs[key] = self._values[index]
        else:
            attrs[key] = None
            self._targets.append((attrs, key, index))


def put(attrs: dict[str, Any], key: str, value: Any) -> None:
    """Set an attribute that may still be on its way from a device."""
    if type(value) is Deferred:
        value.put(attrs, key)
    else:
        attrs[key] = value


def _copy_to_host(flat: torch.Tensor) -> tuple[torch.Tensor, _Event]:
    """A non-blocking copy into pinned memory and the event that says it landed."""
    global _pinning_works
    if flat.is_cpu:
        return flat, _Landed()
    host = None
    if _pinning_works is not False:
        try:
            host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
            _pinning_works = True
        except RuntimeError:
            _pinning_works = False
    if host is None:
        host = torch.empty(flat.shape, dtype=flat.dtype)
    host.copy_(flat, non_blocking=True)
    try:
        # the copy was queued on the source device's current stream: record behind it
        stream = torch.get_device_module(flat.device).current_stream(flat.device)
        event: _Event = torch.Event(device=flat.device)
        event.record(stream)  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError, TypeError, ValueError):  # a backend without events: wait now
        host.copy_(flat)
        event = _Landed()
    return host, event
