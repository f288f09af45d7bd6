"""The overhead a producer measured for itself reaches /metrics: per run, the largest share
any of its producers reports, gone with the run."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from invariants.codec import encode_batch
from invariants.events import make_batch
from invariants.wire import wire_types
from stream_checkers.metrics import CheckerMetrics
from stream_checkers.run_retention import RunRetention

SHARE = "trainwatch_producer_overhead_share"


def _stats_event(**fields) -> dict:
    return {"kind": "meta", "t": 1, "pid": 7, "tid": 1, "stage": "train", "what": "producer_stats",
            "dropped_events": 0, "dropped_batches": 0, **fields}


def test_the_decoded_producer_stats_carry_the_measured_share():
    batch = make_batch(run="r", rank=0, world=1, step=3, seq=0,
                       events=[_stats_event(overhead_budget=0.05, overhead_share=0.042, snapshot_every=16)])
    decoded = wire_types(None).decode(encode_batch(batch))
    assert decoded.events[0].stats()["overhead_share"] == 0.042


def test_the_gauge_shows_the_largest_share_of_a_runs_producers_and_goes_with_the_run():
    now = [0.0]
    registry = CollectorRegistry()
    metrics = CheckerMetrics(registry, RunRetention(idle_retention_s=60, max_runs=10), clock=lambda: now[0])
    metrics.producer_stats("r", (0, 11), {"dropped_events": 0, "overhead_share": 0.03})
    metrics.producer_stats("r", (1, 12), {"dropped_events": 0, "overhead_share": 0.07})
    metrics.producer_stats("r", (0, 11), {"dropped_events": 0, "overhead_share": 0.04})
    assert registry.get_sample_value(SHARE, {"run": "r"}) == 0.07
    metrics.producer_stats("r", (1, 12), {"overhead_share": 0.05})
    assert registry.get_sample_value(SHARE, {"run": "r"}) == 0.05
    metrics.producer_stats("plain", (0, 13), {"dropped_events": 0, "overhead_share": None})
    metrics.producer_stats("plain", (0, 13), {"overhead_share": True})
    assert registry.get_sample_value(SHARE, {"run": "plain"}) is None  # no budget, no series
    now[0] += 61
    assert metrics.forget_expired_runs() == 2
    assert registry.get_sample_value(SHARE, {"run": "r"}) is None
