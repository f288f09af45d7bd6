"""Trend monitors: the classic signal rules over a run's sequence of step summaries.

Invariants catch bugs that barely move the loss; these rules catch the loud ones a
single window cannot see — the built-in rules of SageMaker Debugger are the reference
list (ExplodingTensor, LossNotDecreasing, VanishingGradient, WeightUpdateRatio) plus a
loss-spike detector.  Users get both from one checker.

Rules (thresholds in `TrendRules`):

``nonfinite_loss``        the loss is NaN or infinite.
``nonfinite_gradients``   some gradient norm is NaN or infinite.
``loss_spike``            the median of the last ``spike_persist`` losses exceeds the
                          median of the ``spike_window`` losses before them by a factor
                          of ``spike_factor``, by ``spike_mad_factor`` median absolute
                          deviations, and by ``spike_min_rise`` of the run's loss scale
                          (the highest such median seen); then quiet for
                          ``spike_cooldown`` steps.
``loss_not_decreasing``   over two consecutive blocks of ``plateau_steps`` steps the
                          mean loss fell by less than ``min_relative_decrease``.
``exploding_gradient``    the total grad norm exceeds ``max_grad_norm`` or
                          ``explode_factor`` × the median of recent norms.
``vanishing_gradient``    the total grad norm stays below ``min_grad_norm`` for
                          ``vanish_steps`` consecutive steps.
``update_ratio``          ‖Δw‖/‖w‖ is above ``max_update_ratio`` or below
                          ``min_update_ratio``.

Alerts are edge-triggered: a rule fires on the step where its condition becomes true
and stays quiet while it holds, so a run with a NaN loss at step 40 yields one alert,
not one per remaining step.  Summaries may arrive out of order (steps of one run are
checked on different partitions), so the monitor keeps a short step-sorted history and
judges each step against the steps before it; a step it has already seen is ignored,
which makes replays after a checker restart harmless.  All state is a plain dict.

Why the spike rule is robust rather than a plain ratio: a per-batch loss near
convergence is heavy-tailed noise around a small median (a healthy MLP's loss at
0.04 regularly has batches at 0.3), so "3 x the recent median" fired on about one
step in ten.  A spike a person must act on lasts several steps, rises far beyond the
noise, and is large next to what the loss was at the start; one alert per episode,
rate-limited, is what stays unmuted.
"""

from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping

from .step_summary import StepSummary

@dataclass(frozen=True)
class TrendRules:
    """Thresholds; the defaults follow SageMaker Debugger's built-in rules, except the robust loss spike."""

    spike_factor: float = 3.0
    spike_window: int = 50
    spike_min_history: int = 10
    spike_persist: int = 5
    spike_mad_factor: float = 4.0
    spike_min_rise: float = 0.2
    spike_cooldown: int = 100
    plateau_steps: int = 50
    min_relative_decrease: float = 0.001
    max_grad_norm: float = 1e6
    explode_factor: float = 50.0
    explode_min_history: int = 5
    min_grad_norm: float = 1e-7
    vanish_steps: int = 3
    max_update_ratio: float = 10.0
    min_update_ratio: float = 1e-8
    history: int = 128  # >= 2 * plateau_steps and >= spike_window + spike_persist

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TrendRules":
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown trend rule settings: {sorted(unknown)}")
        return cls(**dict(data))


@dataclass(frozen=True)
class TrendAlert:
    """One rule firing on one step; shaped like an invariant violation downstream."""

    rule: str
    run: str
    step: int
    description: str
    value: float | None = None

    @property
    def id(self) -> str:
        return f"trend:{self.rule}:{self.run}:{self.step}"

    @property
    def relation(self) -> str:
        return f"Trend:{self.rule}"

    def to_violation_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "invariant": f"trend:{self.rule}",
            "relation": self.relation,
            "description": self.description,
            "run": self.run,
            "step": self.step,
            "ranks": [],
            "stage": None,
            "evidence": {"value": _json_number(self.value)},
            "hint": None,
        }


def _json_number(value: float | None) -> float | str | None:
    if value is None or math.isfinite(value):
        return value
    return str(value)


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


@dataclass
class _Point:
    step: int
    loss: float | None
    grad_norm: float | None
    update_ratio: float | None
    nonfinite_grads: int
    flags: list[str] = field(default_factory=list)  # rules whose condition held here


class TrendMonitor:
    """Per-run state of the trend rules; feed it summaries, get alerts back."""

    def __init__(self, run: str, rules: TrendRules | None = None) -> None:
        self.run = run
        self.rules = rules or TrendRules()
        self._points: list[_Point] = []  # sorted by step, bounded by rules.history
        self._steps: list[int] = []
        self._last_plateau_block = -1
        self._loss_scale = 0.0  # highest baseline median seen: the run's loss scale
        self._last_spike_step: int | None = None

    def observe(self, summary: StepSummary) -> list[TrendAlert]:
        index = bisect.bisect_left(self._steps, summary.step)
        if index < len(self._steps) and self._steps[index] == summary.step:
            return []  # replayed summary
        if len(self._points) >= self.rules.history and index == 0:
            return []  # older than anything we still remember
        point = _Point(
            summary.step, summary.loss, summary.grad_norm, summary.update_ratio, summary.nonfinite_grads
        )
        before = self._points[:index]
        conditions = self._conditions(point, before)
        previous_flags = set(before[-1].flags) if before else set()
        point.flags = sorted(conditions)
        self._points.insert(index, point)
        self._steps.insert(index, summary.step)
        if len(self._points) > self.rules.history:
            del self._points[0]
            del self._steps[0]
        alerts = [
            TrendAlert(rule, self.run, summary.step, message, value)
            for rule, (message, value) in sorted(conditions.items())
            if rule not in previous_flags and not self._cooling_down(rule, summary.step)
        ]
        if any(alert.rule == "loss_spike" for alert in alerts):
            self._last_spike_step = summary.step
        alerts.extend(self._plateau())
        return alerts

    def _conditions(self, point: _Point, before: list[_Point]) -> dict[str, tuple[str, float | None]]:
        rules = self.rules
        found: dict[str, tuple[str, float | None]] = {}
        if point.loss is not None and not math.isfinite(point.loss):
            found["nonfinite_loss"] = (f"loss is {point.loss} at step {point.step}", point.loss)
        if point.nonfinite_grads or (point.grad_norm is not None and not math.isfinite(point.grad_norm)):
            found["nonfinite_gradients"] = (
                f"{point.nonfinite_grads or 'some'} gradient(s) are NaN/Inf at step {point.step}",
                point.grad_norm,
            )
        spike = self._loss_spike(point, before)
        if spike is not None:
            found["loss_spike"] = spike
        if _finite(point.grad_norm):
            norm = float(point.grad_norm)  # type: ignore[arg-type]
            recent_norms = [p.grad_norm for p in before[-rules.spike_window :] if _finite(p.grad_norm)]
            median_norm = statistics.median(recent_norms) if len(recent_norms) >= rules.explode_min_history else None
            if norm > rules.max_grad_norm or (
                median_norm is not None and median_norm > 0 and norm > rules.explode_factor * median_norm
            ):
                found["exploding_gradient"] = (f"gradient norm {norm:.4g} exploded at step {point.step}", norm)
            tail = [p.grad_norm for p in before[-(rules.vanish_steps - 1) :]] if rules.vanish_steps > 1 else []
            if (
                norm < rules.min_grad_norm
                and len(tail) == rules.vanish_steps - 1
                and all(_finite(g) and g < rules.min_grad_norm for g in tail)  # type: ignore[operator]
            ):
                found["vanishing_gradient"] = (
                    f"gradient norm {norm:.3g} below {rules.min_grad_norm:g} for "
                    f"{rules.vanish_steps} steps at step {point.step}",
                    norm,
                )
        if point.update_ratio is not None:
            ratio = point.update_ratio
            if not math.isfinite(ratio) or ratio > rules.max_update_ratio:
                found["update_ratio"] = (f"update/weight ratio {ratio:.3g} is too large at step {point.step}", ratio)
            elif ratio < rules.min_update_ratio:
                found["update_ratio"] = (
                    f"update/weight ratio {ratio:.3g} is too small at step {point.step} "
                    "(the optimizer barely changes the weights)",
                    ratio,
                )
        return found

    def _loss_spike(self, point: _Point, before: list[_Point]) -> tuple[str, float] | None:
        """Robust spike test: recent median against the baseline's median and MAD."""
        rules = self.rules
        if not _finite(point.loss):
            return None
        persist = max(rules.spike_persist, 1)
        finite = [float(p.loss) for p in before[-(rules.spike_window + persist - 1):] if _finite(p.loss)]  # type: ignore[arg-type]
        recent = finite[len(finite) - (persist - 1):] if persist > 1 else []
        baseline = finite[: len(finite) - len(recent)][-rules.spike_window:]
        if len(recent) < persist - 1 or len(baseline) < rules.spike_min_history:
            return None
        median = statistics.median(baseline)
        mad = 1.4826 * statistics.median(abs(x - median) for x in baseline)  # ~ sigma for normal noise
        self._loss_scale = max(self._loss_scale, median)
        level = statistics.median([*recent, float(point.loss)])  # type: ignore[arg-type]
        rise = level - median
        if median <= 0 or level <= rules.spike_factor * median or rise <= rules.spike_mad_factor * mad \
                or rise < rules.spike_min_rise * self._loss_scale:
            return None
        return (
            f"loss {level:.4g} (median of the last {persist} steps) is {level / median:.1f}x the median "
            f"{median:.4g} of the {len(baseline)} steps before, at step {point.step}",
            float(point.loss),  # type: ignore[arg-type]
        )

    def _cooling_down(self, rule: str, step: int) -> bool:
        """Rate limit: after a loss spike alert, the rule stays quiet for a while."""
        last = self._last_spike_step
        return rule == "loss_spike" and last is not None and 0 <= step - last < self.rules.spike_cooldown

    def _plateau(self) -> list[TrendAlert]:
        """Compare the two latest complete blocks of ``plateau_steps`` losses."""
        size = self.rules.plateau_steps
        losses = [(p.step, p.loss) for p in self._points if _finite(p.loss)]
        if size <= 0 or len(losses) < 2 * size:
            return []
        block = len(losses) // size - 1  # index of the latest complete block, counted from the start
        if block <= self._last_plateau_block:
            return []
        self._last_plateau_block = block
        earlier = [loss for _, loss in losses[(block - 1) * size : block * size]]
        latest = [loss for _, loss in losses[block * size : (block + 1) * size]]
        before_mean = statistics.fmean(earlier)  # type: ignore[arg-type]
        after_mean = statistics.fmean(latest)  # type: ignore[arg-type]
        decrease = (before_mean - after_mean) / abs(before_mean) if before_mean else 0.0
        if decrease >= self.rules.min_relative_decrease:
            return []
        step = losses[(block + 1) * size - 1][0]
        return [
            TrendAlert(
                "loss_not_decreasing",
                self.run,
                step,
                f"mean loss went from {before_mean:.4g} to {after_mean:.4g} over the {size} steps "
                f"ending at step {step} (less than {self.rules.min_relative_decrease:.2%} decrease)",
                after_mean,
            )
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "plateau_block": self._last_plateau_block,
            "loss_scale": self._loss_scale,
            "last_spike_step": self._last_spike_step,
            "points": [
                [p.step, p.loss, p.grad_norm, p.update_ratio, p.nonfinite_grads, p.flags] for p in self._points
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], rules: TrendRules | None = None) -> "TrendMonitor":
        monitor = cls(str(data["run"]), rules)
        monitor._last_plateau_block = int(data.get("plateau_block", -1))
        monitor._loss_scale = float(data.get("loss_scale") or 0.0)
        last_spike = data.get("last_spike_step")
        monitor._last_spike_step = int(last_spike) if last_spike is not None else None
        for step, loss, grad_norm, ratio, nonfinite, flags in data.get("points", []):
            monitor._points.append(_Point(int(step), loss, grad_norm, ratio, int(nonfinite), list(flags)))
            monitor._steps.append(int(step))
        return monitor
