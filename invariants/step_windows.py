"""Step windows in memory: the driver of the engine for offline ``check``, inference and tests.

The streaming checker keeps its windows in Faust tables; reading trace files needs the
same open/fold/close cycle without them.  Trace files arrive merged in step order rather
than as they happened, so a window can also be closed by the arrival of a newer step
(``grace_steps``) instead of a clock.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import msgpack

from .engine import Engine, RunState
from .model import Violation
from .window import WindowState


class StepWindows:
    """In-memory driver: open windows per (run, step) plus run states.

    ``grace_steps``: a window is force-closed once a batch ``grace_steps`` steps newer
    arrives for its run (a rank that is that far behind is reported missing).
    ``close_when_complete``: close a window as soon as every rank reported its end.
    Replaying trace files merged in step order (`replay`) turns it off and uses
    ``grace_steps=1`` instead, because worker processes of a rank (DataLoader workers)
    write their own files whose batches for a step may come after the rank's step end.
    ``on_close`` sees every closed window before it is evicted (inference uses it);
    ``on_unfinished`` every window `finish` drops unjudged (coverage counts them).
    """

    def __init__(self, engine: Engine, *, grace_steps: int | None = None, close_when_complete: bool = True,
                 on_close: Callable[[WindowState], None] | None = None,
                 on_unfinished: Callable[[WindowState], None] | None = None) -> None:
        self.engine = engine
        self.grace_steps = grace_steps
        self.close_when_complete = close_when_complete
        self.on_close = on_close
        self.on_unfinished = on_unfinished
        self.windows: dict[tuple[str, int], WindowState] = {}
        self.runs: dict[str, RunState] = {}
        self.newest_step: dict[str, int] = {}
        self.late_batches = 0
        self.partial_windows = 0
        self.batches = 0
        self.events = 0

    @classmethod
    def replay(cls, engine: Engine, **kwargs: Any) -> "StepWindows":
        """Driver for batches sorted by step per run (trace files, `trainwatch.tracedir`)."""
        return cls(engine, grace_steps=1, close_when_complete=False, **kwargs)

    def run_state(self, run: str) -> RunState:
        state = self.runs.get(run)
        if state is None:
            state = self.runs[run] = RunState(run)
        return state

    def feed(self, batch: Any) -> list[Violation]:
        """Fold one batch: typed (`invariants.wire`, as ``check`` and ``infer`` decode
        trace files) or a dict (tests, in-memory runs)."""
        if isinstance(batch, dict):
            run, step, events = batch["run"], int(batch["step"]), batch["events"]
        else:
            run, step, events = batch.run, batch.step, batch.events
        self.batches += 1
        self.events += len(events)
        if self.run_state(run).is_closed(step):
            self.late_batches += 1
            return []
        key = (run, step)
        window = self.windows.get(key)
        if window is None:
            window = self.windows[key] = self.engine.new_window(run, step)
        self.engine.add_batch(window, batch)
        violations: list[Violation] = []
        if self.close_when_complete and self.engine.is_complete(window):
            violations.extend(self._close(key))
        if self.grace_steps is not None:
            newest = max(self.newest_step.get(run, step), step)
            self.newest_step[run] = newest
            violations.extend(self.expire(run=run, before_step=newest - self.grace_steps + 1))
        return violations

    def expire(self, *, run: str | None = None, before_step: int | None = None,
               keys: Iterable[tuple[str, int]] | None = None) -> list[Violation]:
        """Force-close windows: the given keys, or those of ``run`` with step < ``before_step``."""
        if keys is None:
            keys = [k for k in self.windows
                    if (run is None or k[0] == run) and (before_step is None or k[1] < before_step)]
        violations: list[Violation] = []
        for key in sorted(keys):
            if key in self.windows:
                violations.extend(self._close(key))
        return violations

    def finish(self) -> list[Violation]:
        """End of input: close everything.

        A window in which *no* rank reported the step end is the tail of a trace that
        stopped mid-step (job killed, trace cut): it is dropped and counted in
        ``partial_windows`` rather than reported as every rank missing.
        """
        tails = [k for k, w in self.windows.items() if not any(f.ended for f in w.ranks.values())]
        for key in tails:
            window = self.windows.pop(key)
            if self.on_unfinished is not None:
                self.on_unfinished(window)
        self.partial_windows += len(tails)
        return self.expire()

    def _close(self, key: tuple[str, int]) -> list[Violation]:
        window = self.windows.pop(key)
        if self.on_close is not None:
            self.on_close(window)
        return self.engine.evaluate(window, self.run_state(key[0]))

    def to_bytes(self) -> bytes:
        """Snapshot of everything open, for tests of restore-mid-stream equivalence."""
        return msgpack.packb(
            {"windows": [w.to_bytes() for w in self.windows.values()],
             "runs": [r.to_bytes() for r in self.runs.values()],
             "newest": self.newest_step, "late": self.late_batches},
            use_bin_type=True,
        )

    def restore(self, data: bytes) -> None:
        obj: dict[str, Any] = msgpack.unpackb(data, raw=False, strict_map_key=False)
        self.windows = {}
        for raw in obj["windows"]:
            window = WindowState.from_bytes(raw)
            self.windows[(window.run, window.step)] = window
        self.runs = {}
        for raw in obj["runs"]:
            state = RunState.from_bytes(raw)
            self.runs[state.run] = state
        self.newest_step = dict(obj["newest"])
        self.late_batches = obj["late"]
