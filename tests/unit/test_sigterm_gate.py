"""SIGTERM that lands while the producer itself is writing waits for the write to end.

The signal is raised from inside a sink's write, while it holds its non-reentrant
lock: exactly where a real SIGTERM lands now and then in a busy training loop.  A
flush from inside the handler would re-enter the write and deadlock (the sink here
detects that instead of hanging).
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

from producers.recorder import StepRecorder
from producers.signals import flush_on_sigterm
from producers.sinks import SinkStats


class SigtermDuringWriteSink:
    """Sends SIGTERM to its own process from inside its first write."""

    name = "sigterm-during-write"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.steps: list[int] = []
        self.reentered = False
        self._armed = True

    def write(self, batch, payload) -> None:
        if not self._lock.acquire(blocking=False):
            self.reentered = True
            return
        try:
            if self._armed:
                self._armed = False
                os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before the next bytecode
            self.steps.append(batch["step"])
        finally:
            self._lock.release()

    def stats(self) -> SinkStats:
        return SinkStats(sent_batches=len(self.steps))

    def close(self, timeout_s: float) -> None:
        pass


def _step_end(**extra) -> dict:
    return {"kind": "step", "t": 1, "pid": 1, "tid": 1, "stage": "train", "phase": "end", **extra}


@pytest.fixture
def own_sigterm_handler():
    """The program's own handler, restored afterwards; records that it ran."""
    ran: list[str] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: ran.append("program's handler"))
    yield ran
    signal.signal(signal.SIGTERM, previous)


def test_sigterm_during_a_batch_write_flushes_after_it_and_then_chains(own_sigterm_handler):
    sink = SigtermDuringWriteSink()
    recorder = StepRecorder("run", 0, 1, [sink])
    handle = flush_on_sigterm(lambda: recorder.end_step(_step_end(final=True)), recorder.gate)
    try:
        recorder.append({"kind": "meta", "t": 1, "pid": 1, "tid": 1, "stage": "train", "what": "mark"})
        recorder.end_step(_step_end())  # SIGTERM arrives inside this step's write
    finally:
        handle.remove()
    assert not sink.reentered
    assert sink.steps == [0, 1]  # the interrupted step, then the final one: in order, once each
    assert own_sigterm_handler == ["program's handler"]


def test_sigterm_outside_the_producer_flushes_at_once(own_sigterm_handler):
    flushed: list[str] = []
    recorder = StepRecorder("run", 0, 1, [])
    handle = flush_on_sigterm(lambda: flushed.append("flush"), recorder.gate)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert flushed == ["flush"] and own_sigterm_handler == ["program's handler"]
    finally:
        handle.remove()
