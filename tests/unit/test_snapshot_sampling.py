"""Snapshot sampling under an overhead budget: the period follows the measured costs, stays
a power of two (ranks keep common snapshot steps) and is reported; without a budget it is
the fixed ``--sample-every``."""

from __future__ import annotations

from producers.sampling import MAX_PERIOD, SnapshotSampler, sampling_note

MS = 1_000_000


class FakeClock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def _run(sampler: SnapshotSampler, clock: FakeClock, steps: int, *, wall_ms: float, events_ms: float,
         snapshot_ms: float, first_step: int = 0) -> list[int]:
    """Steps of a fixed cost; returns the steps that snapshotted."""
    snapshotted = []
    for step in range(first_step, first_step + steps):
        hooks = events_ms
        if sampler.wants(step):
            snapshotted.append(step)
            sampler.snapshot_taken(int(snapshot_ms * MS))
            hooks += snapshot_ms  # snapshots are taken inside the optimizer's hooks
        sampler.clock.hooks_ns += int(hooks * MS)
        clock.now += int(wall_ms * MS)
        sampler.step_ended(step)
    return snapshotted


def test_without_a_budget_every_nth_step_snapshots_and_nothing_is_timed():
    sampler = SnapshotSampler(every=3)
    assert [step for step in range(10) if sampler.wants(step)] == [0, 3, 6, 9]
    assert sampler.clock is None and sampler.report() == {"snapshot_every": 3}
    assert sampling_note(sampler.report()) == "snapshots every 3 steps"
    assert sampling_note(SnapshotSampler().report()) == ""


def test_the_period_keeps_the_measured_share_within_the_budget():
    clock = FakeClock()
    sampler = SnapshotSampler(budget=0.05, clock=clock)
    sampler.step_ended(0)  # the setup window: no known start, not timed
    # 100 ms steps, 1 ms of events, 8 ms per snapshot: 4 ms of headroom -> every 2nd step
    _run(sampler, clock, 8, wall_ms=100, events_ms=1, snapshot_ms=8, first_step=1)
    assert sampler.period == 2
    taken = _run(sampler, clock, 64, wall_ms=100, events_ms=1, snapshot_ms=8, first_step=9)
    assert sampler.period == 2 and taken == [s for s in range(9, 73) if s % 2 == 0]
    window_share = (1 + 8 / 2) / 100
    assert abs(window_share - 0.05) < 1e-9
    report = sampler.report()
    assert report["overhead_budget"] == 0.05 and report["snapshot_every"] == 2
    assert report["timed_steps"] == 72 and report["snapshotted_steps"] == 8 + 32
    assert 0.05 <= report["overhead_share"] < 0.06  # the first window snapshotted every step
    assert "overhead budget 5.0%" in sampling_note(report)


def test_events_alone_over_budget_snapshot_as_rarely_as_allowed_and_a_cheaper_phase_recovers():
    clock = FakeClock()
    sampler = SnapshotSampler(budget=0.05, clock=clock)
    sampler.step_ended(0)
    _run(sampler, clock, 8, wall_ms=1, events_ms=0.2, snapshot_ms=0.5, first_step=1)
    assert sampler.period == MAX_PERIOD
    _run(sampler, clock, MAX_PERIOD, wall_ms=200, events_ms=1, snapshot_ms=4, first_step=9)
    assert sampler.period == 1  # big steps: snapshots fit the budget every step again


def test_periods_are_powers_of_two_at_least_the_fixed_period():
    clock = FakeClock()
    sampler = SnapshotSampler(every=5, budget=0.10, clock=clock)
    assert sampler.period == 8
    sampler.step_ended(0)
    _run(sampler, clock, 16, wall_ms=10, events_ms=0.1, snapshot_ms=30, first_step=1)
    assert sampler.period in {32, 64} and sampler.period & (sampler.period - 1) == 0
