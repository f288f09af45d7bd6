"""Layers with a fused inference path: what a ``TransformerEncoderLayer`` contains is not
judged where torch may have run it as one native kernel (evaluation mode without
gradients), and still is wherever it must run its sub-layers."""

from __future__ import annotations

from invariants.events import MODULE_FORWARD, make_batch
from invariants.inference import Inferencer
from invariants.relations.identity import may_take_fast_path
from tests.support.relation_batches import check

DROPOUT = "torch.nn.functional.dropout"


def _call(cid, api, parent, *, training, grad, mtype=None):
    base = {"kind": "call", "pid": 1, "tid": 1, "stage": "train" if training else "eval", "name": api, "api": api,
            "cid": cid, "parent": parent}
    if mtype:
        base.update(mtype=mtype, module="encoder.layers.0", training=training)
    ctx = {"grad": grad, "autocast": None, "training": training}
    return [dict(base, t=cid, phase="pre", args={}, ctx=ctx), dict(base, t=cid + 1, phase="post", ret=None)]


def _layer(cid, *, training=True, grad=True, fused=False):
    events = _call(cid, MODULE_FORWARD, None, training=training, grad=grad, mtype="TransformerEncoderLayer")
    if not fused:  # the sub-layers ran: dropout is recorded inside the layer
        events[1:1] = _call(cid + 10, DROPOUT, cid, training=training, grad=grad)
    return events


def _step(step, events):
    events = events + [{"kind": "step", "t": step * 1000 + 999, "pid": 1, "tid": 1, "stage": "train", "phase": "end"}]
    return make_batch(run="fast", rank=0, world=1, step=step, seq=step, events=events)


def test_a_fused_evaluation_pass_is_not_judged_and_a_training_pass_without_sub_layers_is():
    inferencer = Inferencer(["EventContain"])
    inferencer.add_trace([_step(s, _layer(s * 1000 + 1) + _layer(s * 1000 + 100, training=False)) for s in range(4)])
    rules = [inv for inv in inferencer.finish() if inv.params.get("form") == "call"
             and inv.params.get("mtype") == "TransformerEncoderLayer" and inv.params.get("child") == DROPOUT]
    assert rules
    fused_eval = [_step(s, _layer(s * 1000 + 1) + _layer(s * 1000 + 100, training=False, grad=False, fused=True))
                  for s in range(4)]
    assert check(rules, fused_eval) == []
    skipped_in_training = [_step(s, _layer(s * 1000 + 1, fused=s == 2)) for s in range(4)]
    assert [v.step for v in check(rules, skipped_in_training)] == [2]


def test_only_evaluation_without_gradients_may_take_the_fast_path():
    layer = {"mtype": "TransformerEncoderLayer", "training": False, "ctx": {"grad": False}}
    assert may_take_fast_path(layer)
    assert not may_take_fast_path(dict(layer, ctx={"grad": True}))
    assert not may_take_fast_path(dict(layer, training=True))
    assert not may_take_fast_path(dict(layer, mtype="Linear"))
