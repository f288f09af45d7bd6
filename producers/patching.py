"""One small helper for the APIs torch offers no hook for: wrap an attribute, removably.

`patch_attribute` returns a handle shaped like torch's ``RemovableHandle``: calling
``remove()`` restores the original.  If somebody else wrapped the attribute on top of
ours in the meantime, restoring would silently drop *their* wrapper, so the handle
then only disables ours (it becomes a pass-through).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

Wrapper = Callable[..., Any]


class PatchHandle:
    """Removes a patch installed by `patch_attribute`; idempotent, usable as a context manager."""

    def __init__(self, owner: Any, attr: str, original: Any, replacement: Any, switch: list[bool]) -> None:
        self.owner = owner
        self.attr = attr
        self.original = original
        self._replacement = replacement
        self._switch = switch

    @property
    def replacement(self) -> Any:
        return self._replacement

    def remove(self) -> None:
        if not self._switch[0]:
            return
        self._switch[0] = False
        if self.owner.__dict__.get(self.attr) is self._replacement:
            setattr(self.owner, self.attr, self.original)

    def __enter__(self) -> "PatchHandle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def patch_attribute(owner: Any, attr: str, make_wrapper: Callable[[Callable[..., Any]], Wrapper]) -> PatchHandle:
    """Replace ``owner.attr`` with ``make_wrapper(original)``, keeping its metadata.

    The replacement checks a switch first, so a removed patch that could not be
    unwound (someone wrapped over it) costs one list lookup and calls the original.
    """
    original = owner.__dict__[attr] if attr in owner.__dict__ else getattr(owner, attr)
    inner = make_wrapper(original)
    switch = [True]

    @functools.wraps(original)
    def replacement(*args: Any, **kwargs: Any) -> Any:
        if switch[0]:
            return inner(*args, **kwargs)
        return original(*args, **kwargs)

    setattr(owner, attr, replacement)
    return PatchHandle(owner, attr, original, replacement, switch)


class PropertyHandle:
    """Removes a property installed by `patch_property`: the class gets back what it
    had (its own attribute, or nothing, so the base class's descriptor shows again)."""

    def __init__(self, owner: Any, attr: str, had_own: bool, original: Any, replacement: property) -> None:
        self.owner = owner
        self.attr = attr
        self._had_own = had_own
        self._original = original
        self._replacement = replacement
        self._removed = False

    def remove(self) -> None:
        if self._removed:
            return
        self._removed = True
        if self.owner.__dict__.get(self.attr) is not self._replacement:
            return  # somebody replaced ours since: theirs stays
        if self._had_own:
            setattr(self.owner, self.attr, self._original)
        else:
            delattr(self.owner, self.attr)


def patch_property(owner: Any, attr: str, make_property: Callable[[Any], property]) -> PropertyHandle:
    """Install ``make_property(descriptor)`` as ``owner.attr``, where ``descriptor`` is the
    data descriptor ``owner.attr`` resolves to now (possibly a base class's)."""
    had_own = attr in owner.__dict__
    original = owner.__dict__[attr] if had_own else next(
        klass.__dict__[attr] for klass in owner.__mro__ if attr in klass.__dict__)
    replacement = make_property(original)
    setattr(owner, attr, replacement)
    return PropertyHandle(owner, attr, had_own, original, replacement)
