"""Per-step training signals (loss, gradient norm, update ratio) folded from batches.

Invariants look at one step window at a time; the classic signal rules (loss spikes,
plateaus, exploding or vanishing gradients) need the *sequence* of steps.  The checker
therefore reduces each closed window to a tiny `StepSummary` and hands the sequence to
`invariants.trends`.  The reduction is incremental (one batch at a time) and its state
is a plain dict, so it can ride along with the window in a Faust table and survive a
worker restart.

Where the numbers come from (all optional — a missing source leaves the field None):

* **loss** — the value summary of the tensor passed to ``torch.Tensor.backward``
  (the ``self`` argument, or the first positional argument).  A scalar summary is
  either a bare number or a tensor summary carrying ``value`` (or ``item``).
* **gradient norm** — ``grad_norm`` of the ``state`` snapshots taken before
  ``Optimizer.step``: the total norm is the root of the sum of squares per rank.
* **update ratio** — ``‖Δw‖ / ‖w‖`` over the parameters snapshotted before and after
  ``Optimizer.step``.  If the producer reports ``update_norm`` it is used; otherwise
  ``|‖w_post‖ − ‖w_pre‖|`` per parameter (a lower bound of ``‖Δw‖``), and a parameter
  whose data digest did not change contributes exactly zero.

Across ranks the loss is averaged (each rank sees its own micro-batch) and the norms
and ratios take the maximum (the worst rank is the one to hear about).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from .events import BACKWARD_APIS
from .wire import payload, wire_types
_PRE_STEP = "pre:torch.optim.Optimizer.step"
_POST_STEP = "post:torch.optim.Optimizer.step"
#: Snapshot attributes the summary reads: a checker's decoder must keep them.
SUMMARY_STATE_ATTRS = ("grad_norm", "data_norm", "data_digest", "update_norm")


@dataclass(frozen=True)
class StepSummary:
    """What the trend monitors know about one step of one run."""

    run: str
    step: int
    loss: float | None = None
    grad_norm: float | None = None
    update_ratio: float | None = None
    nonfinite_grads: int = 0
    ranks: tuple[int, ...] = ()
    stage: str | None = None

    def to_dict(self) -> dict[str, Any]:
        # field by field: dataclasses.asdict deep-copies recursively, and this runs per step
        return {"run": self.run, "step": self.step, "loss": self.loss, "grad_norm": self.grad_norm,
                "update_ratio": self.update_ratio, "nonfinite_grads": self.nonfinite_grads,
                "ranks": list(self.ranks), "stage": self.stage}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "StepSummary":
        return cls(
            run=str(data["run"]),
            step=int(data["step"]),
            loss=_as_float(data.get("loss")),
            grad_norm=_as_float(data.get("grad_norm")),
            update_ratio=_as_float(data.get("update_ratio")),
            nonfinite_grads=int(data.get("nonfinite_grads") or 0),
            ranks=tuple(int(r) for r in data.get("ranks") or ()),
            stage=data.get("stage"),
        )


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    return None


def scalar_of(summary: Any) -> float | None:
    """The number inside a value summary, if the producer recorded one."""
    direct = _as_float(summary)
    if direct is not None:
        return direct
    if isinstance(summary, dict):
        for key in ("value", "item"):
            found = _as_float(summary.get(key))
            if found is not None:
                return found
    return None


@dataclass
class _RankAccumulator:
    loss: float | None = None
    grad_sq: float = 0.0
    grad_count: int = 0
    nonfinite: int = 0
    weight_sq: float = 0.0
    update_sq: float = 0.0
    update_count: int = 0
    pending_pre: dict[str, list[Any]] = field(default_factory=dict)  # name -> [norm, digest]
    stage: str | None = None


class StepSummaryBuilder:
    """Incremental reducer from a window's batches to a `StepSummary`."""

    def __init__(self, run: str, step: int) -> None:
        self.run = run
        self.step = step
        self._ranks: dict[int, _RankAccumulator] = {}

    def add_batch(self, batch: Any) -> None:
        """Fold one typed batch (`wire`), or a dict batch converted first."""
        if isinstance(batch, dict):
            batch = wire_types(None).convert(batch)
        acc = self._ranks.setdefault(batch.rank, _RankAccumulator())
        events = batch.events
        if acc.stage is None and events:
            acc.stage = events[0].stage
        for event in events:  # the hot loop: only optimizer-step snapshots and backward calls count
            kind = event.KIND
            if kind == "state":
                where = event.at
                if where == _PRE_STEP or where == _POST_STEP:
                    self._add_state(acc, event, where)
            elif kind == "call" and event.phase == "pre":
                api = event.api
                if api.__class__ is not str or not api:  # optional, and of any type on the wire
                    api = event.name
                if api in BACKWARD_APIS:
                    self._add_backward(acc, event)

    @staticmethod
    def _add_backward(acc: _RankAccumulator, event: Any) -> None:
        args = payload(event.args)
        if not isinstance(args, dict):
            return
        for key in ("self", "tensors", "0"):
            value = scalar_of(args.get(key))
            if value is not None:
                acc.loss = value
                return

    @staticmethod
    def _add_state(acc: _RankAccumulator, event: Any, where: str) -> None:
        attrs = event.attrs
        name = event.name
        if where == _PRE_STEP:
            grad_norm = _as_float(attrs.get("grad_norm"))
            if grad_norm is not None:
                if math.isfinite(grad_norm):
                    acc.grad_sq += grad_norm * grad_norm
                else:
                    acc.nonfinite += 1
                acc.grad_count += 1
            data_norm = _as_float(attrs.get("data_norm"))
            if data_norm is not None:
                acc.pending_pre[name] = [data_norm, attrs.get("data_digest")]
        else:
            pre = acc.pending_pre.pop(name, None)
            if pre is None:
                return
            pre_norm, pre_digest = pre
            update_norm = _as_float(attrs.get("update_norm"))
            if update_norm is None:
                post_norm = _as_float(attrs.get("data_norm"))
                if post_norm is None:
                    return
                digest = attrs.get("data_digest")
                unchanged = digest is not None and digest == pre_digest
                update_norm = 0.0 if unchanged else abs(post_norm - pre_norm)
            if math.isfinite(pre_norm) and math.isfinite(update_norm):
                acc.weight_sq += pre_norm * pre_norm
                acc.update_sq += update_norm * update_norm
                acc.update_count += 1

    def summary(self) -> StepSummary:
        losses = [a.loss for a in self._ranks.values() if a.loss is not None]
        grad_norms = [
            math.inf if a.nonfinite else math.sqrt(a.grad_sq)
            for a in self._ranks.values()
            if a.grad_count
        ]
        ratios = [
            (math.sqrt(a.update_sq) / math.sqrt(a.weight_sq)) if a.weight_sq > 0 else
            (0.0 if a.update_sq == 0 else math.inf)
            for a in self._ranks.values()
            if a.update_count
        ]
        stages = [a.stage for a in self._ranks.values() if a.stage]
        return StepSummary(
            run=self.run,
            step=self.step,
            loss=(sum(losses) / len(losses)) if losses else None,
            grad_norm=max(grad_norms) if grad_norms else None,
            update_ratio=max(ratios) if ratios else None,
            nonfinite_grads=sum(a.nonfinite for a in self._ranks.values()),
            ranks=tuple(sorted(self._ranks)),
            stage=stages[0] if stages else None,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "step": self.step,
            # vars() rather than asdict(): this runs for every batch of every open window
            "ranks": {str(rank): {**vars(acc), "pending_pre": dict(acc.pending_pre)}
                      for rank, acc in self._ranks.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "StepSummaryBuilder":
        builder = cls(str(data["run"]), int(data["step"]))
        for rank, acc in (data.get("ranks") or {}).items():
            builder._ranks[int(rank)] = _RankAccumulator(**acc)
        return builder


class StepSeries:
    """Every step's summary of a replay, for the report's charts.

    A report draws the whole run, so unlike the trend monitors (which keep a bounded
    history) this keeps one summary per step; a builder is folded into its summary as
    soon as the replay (merged in step order) is two steps past it."""

    def __init__(self) -> None:
        self._open: dict[tuple[str, int], StepSummaryBuilder] = {}
        self._done: list[StepSummary] = []
        self._folded_below: dict[str, int] = {}  # per run: steps below this are summarised

    def add_batch(self, batch: Any) -> None:
        """Fold one typed batch (`wire`), or a dict batch converted first."""
        if isinstance(batch, dict):
            batch = wire_types(None).convert(batch)
        key = (batch.run, batch.step)
        builder = self._open.get(key)
        if builder is None:
            if batch.step < self._folded_below.get(batch.run, batch.step):
                return  # a late batch (a DataLoader worker's file) of a step already drawn
            builder = self._open[key] = StepSummaryBuilder(batch.run, batch.step)
            below = batch.step - 1
            if below > self._folded_below.get(batch.run, below - 1):
                self._folded_below[batch.run] = below
                self._fold(batch.run, before_step=below)
        builder.add_batch(batch)

    def _fold(self, run: str | None, before_step: int | None = None) -> None:
        for key in [k for k in self._open if (run is None or k[0] == run)
                    and (before_step is None or k[1] < before_step)]:
            self._done.append(self._open.pop(key).summary())

    def summaries(self) -> list[StepSummary]:
        """Step-ordered summaries per run; the steps still open are folded first."""
        self._fold(None)
        return sorted(self._done, key=lambda s: (s.run, s.step))
