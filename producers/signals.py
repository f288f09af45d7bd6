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

Python runs a signal handler in the main thread between two bytecodes of whatever it
was doing.  When that was trainwatch itself writing a batch (holding a sink's
non-reentrant lock) or halfway through ending a step, flushing from inside the
handler would deadlock on the lock or ship a step twice, so such code runs inside a
`TerminationGate` region and the handler's work waits until the outermost region
is left: microseconds to one batch write later.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any, Callable


class TerminationGate:
    """Regions of the main thread that SIGTERM's flush must not interrupt.

    Used as a context manager around the producer's multi-statement updates (ending a
    step, writing batches, closing).  Other threads enter freely: the handler only
    ever interrupts the main thread, and a lock another thread holds is released by
    that thread.
    """

    def __init__(self) -> None:
        self._main_thread = threading.main_thread().ident
        self._depth = 0
        self._deferred: Callable[[], None] | None = None

    def __enter__(self) -> "TerminationGate":
        if threading.get_ident() == self._main_thread:
            self._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        if threading.get_ident() != self._main_thread or self._depth == 0:
            return
        self._depth -= 1
        if self._depth == 0 and self._deferred is not None:
            action, self._deferred = self._deferred, None
            action()

    def run_or_defer(self, action: Callable[[], None]) -> None:
        """Run ``action`` now, or when the main thread leaves the region it is in."""
        if self._depth:
            self._deferred = action
        else:
            action()

    def reset_after_fork(self) -> None:
        """In a forked child the forking thread is the only one, outside any region."""
        self._main_thread = threading.get_ident()
        self._depth = 0
        self._deferred = None


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


def flush_on_sigterm(flush: Callable[[], None], gate: TerminationGate) -> TermHandle | None:
    """Run ``flush`` on SIGTERM (outside ``gate``'s regions), then chain to the previous
    disposition; None if not installed."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_IGN:
        return None

    def on_sigterm(signum: int, frame: Any) -> None:
        gate.run_or_defer(lambda: terminate(signum, frame))

    def terminate(signum: int, frame: Any) -> None:
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
