"""Pure unit tests of the per-step summaries and the trend monitors."""

from __future__ import annotations

import math

import msgpack
import pytest

from invariants.events import make_batch
from invariants.step_summary import StepSummary, StepSummaryBuilder
from invariants.trends import TrendMonitor, TrendRules


def _event(kind: str, **fields):
    return {"kind": kind, "t": 1, "pid": 1, "tid": 1, "stage": "train", **fields}


def _rank_batch(rank: int, step: int, *, loss, grads, pre, post, digests=None, seq=0):
    events = [
        _event("call", name="torch.Tensor.backward", api="torch.Tensor.backward", phase="pre", cid=1,
               args={"self": {"T": "tensor", "shape": [], "dtype": "float32", "value": loss}}),
    ]
    for name, g in grads.items():
        events.append(_event("state", name=name, at="pre:torch.optim.Optimizer.step",
                             attrs={"grad_norm": g, "data_norm": pre[name], "data_digest": f"a{name}"}))
    for name, w in post.items():
        digest = (digests or {}).get(name, f"b{name}")
        events.append(_event("state", name=name, at="post:torch.optim.Optimizer.step",
                             attrs={"grad_norm": grads[name], "data_norm": w, "data_digest": digest}))
    events.append(_event("step", phase="end"))
    return make_batch(run="r", rank=rank, world=2, step=step, seq=seq, events=events)


def test_summary_folds_loss_grad_norm_and_update_ratio_across_ranks():
    builder = StepSummaryBuilder("r", 3)
    builder.add_batch(_rank_batch(0, 3, loss=1.0, grads={"w": 3.0, "b": 4.0}, pre={"w": 10.0, "b": 0.0},
                                  post={"w": 10.5, "b": 0.0}))
    builder.add_batch(_rank_batch(1, 3, loss=3.0, grads={"w": 3.0, "b": 4.0}, pre={"w": 10.0, "b": 0.0},
                                  post={"w": 10.0, "b": 0.0}, digests={"w": "aw", "b": "ab"}))
    # the builder state survives a round trip through msgpack (a Faust table value)
    restored = StepSummaryBuilder.from_dict(msgpack.unpackb(msgpack.packb(builder.to_dict())))
    summary = restored.summary()
    assert summary.loss == pytest.approx(2.0)
    assert summary.grad_norm == pytest.approx(5.0)
    assert summary.update_ratio == pytest.approx(0.05)  # rank 0: 0.5 / 10; rank 1 unchanged: 0
    assert summary.ranks == (0, 1)
    assert StepSummary.from_dict(summary.to_dict()) == summary


def test_summary_counts_nonfinite_gradients_and_tolerates_missing_sources():
    builder = StepSummaryBuilder("r", 0)
    builder.add_batch(_rank_batch(0, 0, loss=None, grads={"w": math.nan}, pre={"w": 1.0}, post={"w": 1.1}))
    summary = builder.summary()
    assert summary.loss is None
    assert summary.nonfinite_grads == 1
    assert math.isinf(summary.grad_norm)
    empty = StepSummaryBuilder("r", 1).summary()
    assert (empty.loss, empty.grad_norm, empty.update_ratio) == (None, None, None)


def _summaries(losses, grad_norm=1.0, ratio=1e-3):
    return [StepSummary("r", step, loss=loss, grad_norm=grad_norm, update_ratio=ratio)
            for step, loss in enumerate(losses)]


def _run(monitor, summaries):
    return [(a.rule, a.step) for s in summaries for a in monitor.observe(s)]


def test_healthy_decreasing_loss_raises_nothing():
    monitor = TrendMonitor("r", TrendRules(plateau_steps=10))
    assert _run(monitor, _summaries([2.0 * 0.97 ** i for i in range(60)])) == []


def test_nan_loss_fires_once_per_episode():
    losses = [1.0, 0.9, math.nan, math.nan, math.nan, 0.8, math.inf]
    alerts = _run(TrendMonitor("r", TrendRules(plateau_steps=0)), _summaries(losses))
    assert alerts == [("nonfinite_loss", 2), ("nonfinite_loss", 6)]


_BASELINE = [1.0, 1.02, 0.98, 0.97, 1.01, 0.96, 0.99, 1.0, 0.95, 0.97, 0.98, 0.96]  # 12 steps


def test_loss_spike_that_persists_fires_once_a_single_outlier_does_not():
    losses = _BASELINE + [5.0] + _BASELINE[:3] + [5.0, 5.2, 4.9, 5.1, 5.0, 5.3, 0.9]
    alerts = _run(TrendMonitor("r", TrendRules(plateau_steps=0)), _summaries(losses))
    assert alerts == [("loss_spike", 18)]  # 3 of the last 5 steps (16..18) are high: the median is


def test_plateau_detected_after_two_flat_blocks():
    rules = TrendRules(plateau_steps=5)
    alerts = _run(TrendMonitor("r", rules), _summaries([1.0] * 10))
    assert alerts == [("loss_not_decreasing", 9)]


def test_exploding_and_vanishing_gradients_and_update_ratio():
    rules = TrendRules(plateau_steps=0, vanish_steps=3)
    norms = [1.0, 1.1, 0.9, 1.0, 1.05, 500.0, 1.0, 1e-9, 1e-9, 1e-9]
    summaries = [StepSummary("r", i, loss=1.0 / (i + 1), grad_norm=n, update_ratio=1e-3) for i, n in enumerate(norms)]
    summaries.append(StepSummary("r", 10, loss=0.05, grad_norm=1.0, update_ratio=0.0))
    summaries.append(StepSummary("r", 11, loss=0.04, grad_norm=1.0, update_ratio=20.0))
    alerts = _run(TrendMonitor("r", rules), summaries)
    assert alerts == [("exploding_gradient", 5), ("vanishing_gradient", 9), ("update_ratio", 10)]


def test_out_of_order_and_replayed_summaries_are_judged_once():
    losses = _BASELINE + [5.0, 5.2, 4.9, 5.1, 5.0, 0.93]
    ordered = _summaries(losses)
    shuffled = ordered[:12] + [ordered[13], ordered[12], ordered[14], ordered[15], ordered[17], ordered[16]]
    monitor = TrendMonitor("r", TrendRules(plateau_steps=0))
    assert _run(monitor, shuffled) == [("loss_spike", 14)]
    # replays (a restarted checker re-reading its input) produce nothing new
    restored = TrendMonitor.from_dict(msgpack.unpackb(msgpack.packb(monitor.to_dict())), monitor.rules)
    assert _run(restored, ordered) == []


def test_alert_is_violation_shaped_with_stable_id():
    alert = TrendMonitor("run-7", TrendRules(plateau_steps=0)).observe(StepSummary("run-7", 4, loss=math.nan))[0]
    record = alert.to_violation_dict()
    assert record["id"] == "trend:nonfinite_loss:run-7:4"
    assert record["relation"] == "Trend:nonfinite_loss"
    assert record["evidence"]["value"] == "nan"
    msgpack.packb(record)


def test_unknown_rule_settings_are_rejected():
    with pytest.raises(ValueError, match="unknown trend rule"):
        TrendRules.from_dict({"spike_factr": 2})


def test_step_summary_dict_has_every_field_and_round_trips():
    from dataclasses import fields

    summary = StepSummary("r", 3, loss=1.0, grad_norm=2.0, update_ratio=0.1, nonfinite_grads=1, ranks=(0, 1),
                          stage="train")
    data = summary.to_dict()
    assert set(data) == {f.name for f in fields(StepSummary)}
    assert StepSummary.from_dict(msgpack.unpackb(msgpack.packb(data))) == summary
