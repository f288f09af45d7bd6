"""The process-wide slot for the one active session.

Torch's global hooks are process-global, so instrumentation is too: at most one
session per process.  This module is the only place that remembers it, which is what
fork handlers, DataLoader worker wrappers and the auto-installer need to find it.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .session import Session


class _ActiveSession:
    def __init__(self) -> None:
        self.session: Session | None = None
        self.lock = threading.Lock()
        self.fork_handler_installed = False


_ACTIVE = _ActiveSession()


def active_session() -> "Session | None":
    return _ACTIVE.session


def activate(session: "Session") -> None:
    with _ACTIVE.lock:
        if _ACTIVE.session is not None and _ACTIVE.session is not session:
            raise RuntimeError("a trainwatch session is already active in this process")
        _ACTIVE.session = session
        if not _ACTIVE.fork_handler_installed:
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _ACTIVE.fork_handler_installed = True


def deactivate(session: "Session") -> None:
    with _ACTIVE.lock:
        if _ACTIVE.session is session:
            _ACTIVE.session = None


def _after_fork_in_child() -> None:
    session = _ACTIVE.session
    if session is not None:
        _ACTIVE.lock = threading.Lock()  # the parent may have held it at fork time
        session.on_fork_child()


def close_worker_session() -> None:
    session = _ACTIVE.session
    if session is not None:
        session.close_worker()


def install_from_env() -> "Session | None":
    """Start instrumentation from ``TRAINWATCH_*`` (called once torch has been imported)."""
    if _ACTIVE.session is not None:
        return _ACTIVE.session
    try:
        from .config import ProducerConfig
        from .session import Session

        session = Session(ProducerConfig.from_env(), close_at_exit=True)
    except Exception as exc:  # never take the user's program down
        print(f"trainwatch: instrumentation disabled: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None
    return session


def register_exit(callback: "object") -> None:
    """(Re-)register an exit callback so it runs before handlers registered so far."""
    atexit.unregister(callback)  # type: ignore[arg-type]
    atexit.register(callback)  # type: ignore[arg-type]
