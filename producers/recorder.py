"""Per-(rank, step) batching of events and delivery to the sinks.

Events accumulate in a buffer for the open step.  A step's batches are flushed when
the step ends; a very long step is flushed early in several batches of the same step
(``seq`` increases per producer, so a gap means loss).  The last batch of a step holds
its ``step``/``end`` event.  Nothing here knows about torch: the session decides
*when* a step ends, the recorder only keeps the wire contract.

A batch may hold values still on their way from an accelerator (`Pending`, see
`producers.readback`).  It is then not encoded at once but held, in ``seq`` order,
until the next step boundary, where it is resolved (waiting only if its copy has
not landed yet); close, ``flush_partial`` and ``wait_delivered`` resolve everything.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from invariants.codec import encode_batch
from invariants.events import Batch, Event, make_batch

from .signals import TerminationGate
from .sinks import Sink


class Pending(Protocol):
    """Values that fill buffered events in place once resolved."""

    def ready(self) -> bool: ...

    def resolve(self) -> None: ...


#: force every held batch out, whatever its step
_ALL = float("inf")


@dataclass
class RecorderCounters:
    """What this process produced, for its summary."""

    batches: int = 0
    events: int = 0


class StepRecorder:
    """Buffers the open step's events and ships them as contract batches."""

    def __init__(
        self,
        run: str,
        rank: int,
        world: int,
        sinks: Sequence[Sink],
        *,
        max_events_per_batch: int = 4096,
        gate: TerminationGate | None = None,
    ) -> None:
        self.run = run
        self.rank = rank
        self.world = world
        self.step = 0
        self.sinks = list(sinks)
        self.max_events = max_events_per_batch
        self.counters = RecorderCounters()
        # Multi-statement updates run inside it, so SIGTERM's flush never re-enters them.
        self.gate = gate if gate is not None else TerminationGate()
        self._seq = 0
        self._buffer: list[Event] = []
        self._flushed_in_step = 0  # events of the open step already shipped early
        self._lock = threading.RLock()  # events may come from DataLoader/autograd threads
        self._waiting: list[Pending] = []  # registered since the last batch was made
        self._held: deque[tuple[Batch, list[Pending]]] = deque()  # made, not yet encoded

    def await_readback(self, pending: Pending) -> None:
        """Hold the batch that will carry the events ``pending`` fills until it is resolved.

        Call it before appending those events: the next batch made takes it along, and
        held batches are released in order, so it is resolved before any later batch.
        """
        with self._lock:
            self._waiting.append(pending)

    # -- buffering ------------------------------------------------------------------
    def append(self, event: Event) -> None:
        with self._lock:
            self._buffer.append(event)
            if len(self._buffer) >= self.max_events:
                with self.gate:
                    self._flushed_in_step += len(self._buffer)
                    self._flush(self._buffer)
                    self._buffer = []

    def extend(self, events: Sequence[Event]) -> None:
        with self._lock:
            for event in events:
                self.append(event)

    @property
    def position(self) -> int:
        """Index of the next event within the open step (counting early-flushed ones)."""
        return self._flushed_in_step + len(self._buffer)

    def relabel_stage(self, from_position: int, old: str, new: str) -> None:
        """Re-tag the open step's buffered events from ``from_position`` on (a stage that
        is only known once it has begun); events already shipped keep theirs."""
        with self._lock:
            for event in self._buffer[max(from_position - self._flushed_in_step, 0):]:
                if event.get("stage") == old:
                    event["stage"] = new

    @property
    def pending(self) -> int:
        return len(self._buffer)

    # -- step boundaries ------------------------------------------------------------
    def end_step(
        self,
        end_event: Event,
        *,
        at: int | None = None,
        before_end: Sequence[Event] = (),
        next_begin: Event | None = None,
    ) -> None:
        """Close the open step with ``end_event``; events after index ``at`` move to the next.

        ``at`` lets the session end a step retroactively (a multi-optimizer cycle is
        only recognised when the first optimizer steps again).
        """
        with self.gate, self._lock:
            at = len(self._buffer) if at is None else min(max(at - self._flushed_in_step, 0), len(self._buffer))
            carried = self._buffer[at:]
            events = self._buffer[:at]
            events.extend(before_end)
            events.append(end_event)
            self._flush(events)
            self._release(force_before=self.step)  # the previous steps' values are due
            self._buffer = ([next_begin] if next_begin is not None else []) + carried
            self._flushed_in_step = 0
            self.step += 1

    def flush_partial(self) -> None:
        """Ship what is buffered without ending the step (e.g. before a fork)."""
        with self.gate, self._lock:
            if self._buffer:
                self._flushed_in_step += len(self._buffer)
                self._flush(self._buffer)
                self._buffer = []
            self._release(force_before=_ALL)

    def _flush(self, events: list[Event]) -> None:
        if not events:
            return
        batch = make_batch(
            run=self.run, rank=self.rank, world=self.world, step=self.step, seq=self._seq, events=events
        )
        # Not part of the required header: lets a reader tell producers of one rank
        # apart (a DataLoader worker numbers its own batches from 0).
        batch["pid"] = os.getpid()
        self._seq += 1
        waiting, self._waiting = self._waiting, []
        self._held.append((batch, waiting))
        self._release(force_before=None)

    def _release(self, force_before: float | None) -> None:
        """Encode held batches in order: those whose values have landed, and those of
        steps before ``force_before`` in any case (waiting for their values)."""
        while self._held:
            batch, waiting = self._held[0]
            if force_before is None or batch["step"] >= force_before:
                if not all(pending.ready() for pending in waiting):
                    return
            for pending in waiting:
                try:
                    pending.resolve()
                except Exception:  # a failed device read leaves its values None; ship the rest
                    pass
            self._held.popleft()
            self._write(batch)

    def _write(self, batch: Batch) -> None:
        events = batch["events"]
        try:
            payload = encode_batch(batch)
        except Exception:  # an unencodable summary must not take the step down with it
            payload = encode_batch(_sanitised(batch))
        self.counters.batches += 1
        self.counters.events += len(events)
        for sink in self.sinks:
            sink.write(batch, payload)

    def wait_delivered(self, timeout_s: float) -> bool:
        """Block (at most ``timeout_s``) until the sinks delivered what was flushed."""
        deadline = time.monotonic() + timeout_s
        with self.gate, self._lock:
            self._release(force_before=_ALL)
        return all([sink.wait_delivered(max(deadline - time.monotonic(), 0.0)) for sink in self.sinks])

    def close_sinks(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with self.gate:
            with self._lock:
                self._release(force_before=_ALL)
            for sink in self.sinks:
                sink.close(max(deadline - time.monotonic(), 0.0))

    def reset_after_fork(self) -> None:
        """A forked child starts with an empty buffer and its own sequence numbers."""
        self._lock = threading.RLock()
        self.gate.reset_after_fork()
        self._buffer = []
        self._flushed_in_step = 0
        self._seq = 0
        self._waiting = []
        self._held = deque()  # the parent ships what it had made
        self.counters = RecorderCounters()
        for sink in self.sinks:
            forget = getattr(sink, "forget_after_fork", None)
            if forget is not None:
                forget()


def _sanitised(batch: Batch) -> Batch:
    """Replace anything msgpack refuses by its repr, keeping the batch shape."""

    def clean(value: Any) -> Any:
        if value is None or isinstance(value, (bool, int, float, str, bytes)):
            if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
                return str(value)
            return value
        if isinstance(value, dict):
            return {str(k): clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return repr(value)[:200]

    return clean(batch)
