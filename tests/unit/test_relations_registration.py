"""ModuleRegistration: a layer run inside a model with gradients is registered there or
trained by an optimizer; only nested forwards with parameters and gradients are judged."""

from __future__ import annotations

from invariants.events import MODULE_FORWARD, make_batch
from invariants.inference import Inferencer
from invariants.relations import TEMPLATES
from tests.support.relation_batches import check


def _forward(cid, *, parent, mtype, ctx, stage="train"):
    base = {"kind": "call", "pid": 1, "tid": 1, "stage": stage, "name": f"{mtype}.forward", "api": MODULE_FORWARD,
            "cid": cid, "parent": parent, "mtype": mtype, "training": True}
    return [dict(base, t=cid, phase="pre", args={}, ctx=ctx), dict(base, t=cid + 1, phase="post", ret=None)]


def _step(step, *, unregistered=False, frozen_pass=False):
    cid = step * 100
    events = _forward(cid + 1, parent=None, mtype="Net", ctx={"grad": True})
    for index in range(3):
        ctx = {"grad": True, **({"unregistered": True} if unregistered and index == 2 else {})}
        events += _forward(cid + 10 + index * 2, parent=cid + 1, mtype="Linear", ctx=ctx)
    events += _forward(cid + 20, parent=cid + 1, mtype="ReLU", ctx={"grad": True, "no_params": True})
    if frozen_pass:  # a teacher kept in a list, run without gradients: never judged
        events += _forward(cid + 30, parent=cid + 1, mtype="Linear", ctx={"grad": False, "unregistered": True})
    events.append({"kind": "step", "t": cid + 90, "pid": 1, "tid": 1, "stage": "train", "phase": "end"})
    return make_batch(run="reg", rank=0, world=1, step=step, seq=step, events=events)


def _inferred():
    inferencer = Inferencer(["ModuleRegistration"])
    inferencer.add_trace([_step(s) for s in range(4)])
    return inferencer.finish()


def test_a_layer_no_model_registers_and_no_optimizer_trains_is_reported_from_the_step_it_runs():
    invariants = _inferred()
    assert [inv.params for inv in invariants] == [{"api": MODULE_FORWARD}]
    assert invariants[0].precondition is None
    run = [_step(s, unregistered=s >= 2, frozen_pass=True) for s in range(4)]
    assert [(v.step, v.invariant) for v in check(invariants, run)] == [(2, invariants[0].id), (3, invariants[0].id)]
    assert check(invariants, [_step(s, frozen_pass=True) for s in range(4)]) == []


def test_parameters_are_validated():
    template = TEMPLATES["ModuleRegistration"]
    assert template.validate_params({"api": MODULE_FORWARD}) is None
    assert template.validate_params({"api": "torch.optim.Optimizer.step"}) == "api"
    assert "nn.ModuleList" in template.hint({"api": MODULE_FORWARD})
