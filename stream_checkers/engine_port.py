"""The narrow interface between the Faust agents and the pure invariant engine.

The agents never look inside a window: they open one, fold batches into it, ask
whether it is complete, evaluate it at close, and move its state in and out of
tables as bytes.  Everything about relations lives in `invariants.engine`; this
module only adapts its objects to those six verbs so that the app stays testable and
the engine can evolve without touching the streaming code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class InvariantsUnavailable(RuntimeError):
    """The invariant file (or the shipped default set) cannot be loaded."""


@dataclass
class EnginePort:
    engine: Any
    window_type: Any
    run_state_type: Any
    #: the typed decoder for this invariant set (`invariants.wire`)
    wire: Any = None

    @classmethod
    def load(cls, invariants_path: str | None) -> "EnginePort":
        """Load the invariant set (the shipped default without a path) and build an engine."""
        from invariants import engine as engine_module
        from invariants.invariant_file import load_default_set, load_set

        try:
            if invariants_path:
                with open(invariants_path, "rb") as handle:
                    invariant_set = load_set(handle.read(), invariants_path)
            else:
                invariant_set = load_default_set()
        except (OSError, ValueError) as exc:
            raise InvariantsUnavailable(str(exc)) from exc
        from invariants.step_summary import SUMMARY_STATE_ATTRS
        from invariants.wire import wire_types

        engine = engine_module.Engine(invariant_set)
        # decode only the snapshot attributes the fold keeps and the step summary reads
        kept = engine.plan.kept_attrs()
        wire = wire_types(None if kept is None else (*kept, *SUMMARY_STATE_ATTRS))
        return cls(engine, engine_module.WindowState, engine_module.RunState, wire)

    @property
    def invariant_count(self) -> int:
        return len(self.engine.invariant_set)

    def decode(self, payload: bytes, max_bytes: int) -> Any:
        """One message as a typed batch; a `SchemaError` names what is wrong with it."""
        return self.wire.decode(payload, max_bytes=max_bytes)

    def open(self, run: str, step: int) -> Any:
        return self.engine.new_window(run, step)

    def add(self, window: Any, batch: Any) -> None:
        self.engine.add_batch(window, batch)

    def complete(self, window: Any) -> bool:
        return bool(self.engine.is_complete(window))

    def missing_ranks(self, window: Any) -> list[int]:
        return list(window.missing_ranks())

    def missing_workers(self, window: Any) -> int:
        """Announced DataLoader workers of the window that have not reported."""
        return int(window.missing_workers())

    def coverage(self, window: Any) -> Any:
        """What the window checked (`invariants.coverage.WindowCoverage`), read before it is evaluated."""
        from invariants.coverage import window_coverage

        return window_coverage(window)

    def evaluate(self, window: Any, run_state: Any) -> list[dict[str, Any]]:
        return [violation.to_dict() for violation in self.engine.evaluate(window, run_state)]

    def dump_window(self, window: Any) -> bytes:
        return window.to_bytes()

    def load_window(self, data: bytes) -> Any:
        return self.window_type.from_bytes(data)

    def new_run_state(self, run: str) -> Any:
        return self.run_state_type(run)

    def compact_run_state(self, state: Any, keep: int = 128) -> None:
        """Bound a partition-local run state.

        A partition sees an irregular subset of a run's steps (keys are hashed), so the
        engine's "closed steps above the watermark" set would only grow.  Steps below
        the oldest kept one either closed here or belong to other partitions and never
        arrive here, so raising the watermark to it keeps `is_closed` exact for every
        step this partition will see that has no window record.
        """
        above = getattr(state, "closed_above", None)
        # trimmed to ``keep`` only once it holds twice that: one sort per ``keep`` closes
        if isinstance(above, set) and len(above) > 2 * keep:
            kept = sorted(above)[-keep:]
            state.closed_above = set(kept)
            state.closed_below = max(state.closed_below, kept[0])

    def is_closed(self, run_state: Any, step: int) -> bool:
        return bool(run_state.is_closed(step))

    def dump_run_state(self, state: Any) -> bytes:
        return state.to_bytes()

    def load_run_state(self, data: bytes) -> Any:
        return self.run_state_type.from_bytes(data)
