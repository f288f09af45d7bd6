"""Safe defaults under hostile or careless use: secrets, unbounded labels, mixed runs,
noisy alerts, and the command line a new user meets first."""

from __future__ import annotations

import math
import random

from invariants.step_summary import StepSummary
from invariants.trends import TrendMonitor, TrendRules


# -- trend monitor: noise around a small loss is not a spike ---------------------------------
def _healthy_noisy_losses(steps: int, seed: int) -> list[float]:
    """A loss that falls from 1.4 to a floor of 0.03, each batch off by a lognormal factor.

    Per-batch losses near convergence are heavy-tailed around a small median (the
    healthy examples/mlp.py has batches at 8x its median), the shape that made the old
    "3 x the recent median" rule fire on one step in ten.
    """
    rng = random.Random(seed)
    return [(1.4 * math.exp(-step / 2000) + 0.03) * rng.lognormvariate(0.0, 0.5) for step in range(steps)]


def _spike_alerts(losses: list[float]) -> list[int]:
    monitor = TrendMonitor("r", TrendRules(plateau_steps=0))
    return [alert.step for step, loss in enumerate(losses)
            for alert in monitor.observe(StepSummary("r", step, loss=loss, grad_norm=1.0, update_ratio=1e-3))
            if alert.rule == "loss_spike"]


def test_long_healthy_noisy_run_raises_at_most_one_loss_spike():
    losses = _healthy_noisy_losses(20_000, seed=3)
    assert len(_spike_alerts(losses)) <= 1


def test_real_spikes_still_fire_promptly_early_and_late_in_a_noisy_run():
    losses = _healthy_noisy_losses(20_000, seed=3)
    for onset, height in ((3_000, 1.5), (15_000, 1.0)):  # back near the starting loss for 30 steps
        losses[onset:onset + 30] = [height] * 30
    alerts = _spike_alerts(losses)
    assert [step for step in alerts if 3_000 <= step < 3_030] == [3_002]
    assert [step for step in alerts if 15_000 <= step < 15_030] == [15_002]


def test_repeated_spikes_within_the_cooldown_alert_once():
    losses = _healthy_noisy_losses(6_000, seed=5)
    for onset in (5_000, 5_020, 5_040):  # three bursts of six high steps, 20 steps apart
        losses[onset:onset + 6] = [1.5] * 6
    assert [step for step in _spike_alerts(losses) if step >= 5_000] == [5_002]
