"""Flushing the open step when the training process is asked to terminate (SIGTERM).

torchrun, Kubernetes and Slurm stop workers with SIGTERM.  Python's default action
for it kills the process at once, without ``atexit`` handlers, so the step in
progress — often the very step that shows why the job was stopped — would never be
written.  The handler installed here closes the session (bounded by its flush
timeout) and then does whatever would have happened without it:

* a handler the program had installed before instrumentation started is called;
* the default action is restored and the signal re-sent, so the process still dies
  *by SIGTERM* (exit status and parent-side semantics unchanged);
* a program that ignores SIGTERM is left alone: no handler is installed at all.

A handler the program installs *after* instrumentation started simply replaces this
one (the program's choice wins; the trace then ends at the last flushed step).
Handlers can only be installed from the main thread; elsewhere this is a no-op.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any, Callable


class TermHandle:
    """Removes the SIGTERM handler again, restoring the one it wrapped (if still ours)."""

    def __init__(self, previous: Any, handler: Callable[[int, Any], None]) -> None:
        self._previous = previous
        self._handler: Callable[[int, Any], None] | None = handler

    def remove(self) -> None:
        handler, self._handler = self._handler, None
        if handler is None or threading.current_thread() is not threading.main_thread():
            return
        try:
            if signal.getsignal(signal.SIGTERM) is handler:
                signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
        except (ValueError, OSError):  # interpreter shutting down
            pass


def flush_on_sigterm(flush: Callable[[], None]) -> TermHandle | None:
    """Run ``flush`` on SIGTERM, then chain to the previous disposition; None if not installed."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_IGN:
        return None

    def on_sigterm(signum: int, frame: Any) -> None:
        try:
            flush()
        except Exception:  # the flush reports its own errors; termination must go on
            pass
        if callable(previous):
            previous(signum, frame)
            return
        # Default action (or a handler not set from Python): die by the signal itself.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except (ValueError, OSError):
        return None
    return TermHandle(previous, on_sigterm)
