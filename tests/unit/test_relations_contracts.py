"""ApiContract: the producer's answer to an API's documented contract becomes a site;
only the API a contract is about may carry it, and only booleans count."""

from __future__ import annotations

import pytest

from invariants.contract_apis import CONTRACTS
from invariants.events import CLIP_GRAD_NORM, MODULE_LOAD_STATE_DICT, OPTIMIZER_STEP, make_batch
from invariants.inference import Inferencer
from invariants.relations import TEMPLATES
from tests.support.relation_batches import check


def _call(cid, api, contract, stage="train"):
    base = {"kind": "call", "pid": 1, "tid": 1, "stage": stage, "name": api, "api": api, "cid": cid, "parent": None}
    ctx = {"grad": True, "autocast": None, "training": True, "contract": contract}
    return [dict(base, t=cid, phase="pre", args={}, ctx=ctx), dict(base, t=cid + 1, phase="post", ret=None)]


def _step(step, *, scaled=False, restart=False, misplaced=False):
    cid = step * 100
    events = _call(cid + 1, CLIP_GRAD_NORM, {"unscaled_grads": not scaled})
    events += _call(cid + 3, OPTIMIZER_STEP, {"keeps_optimizer_state": not restart})
    if misplaced:  # a contract on an API it is not about, and a non-boolean answer: ignored
        events += _call(cid + 5, OPTIMIZER_STEP, {"unscaled_grads": False, "keeps_optimizer_state": "no"})
    events.append({"kind": "step", "t": cid + 90, "pid": 1, "tid": 1, "stage": "train", "phase": "end"})
    return make_batch(run="contract", rank=0, world=1, step=step, seq=step, events=events)


def _inferred():
    inferencer = Inferencer(["ApiContract"])
    inferencer.add_trace([_step(s) for s in range(4)])
    return inferencer.finish()


def test_each_contract_kept_in_the_references_is_learned_and_its_breach_reported_at_its_step():
    invariants = _inferred()
    assert sorted(inv.params["contract"] for inv in invariants) == ["keeps_optimizer_state", "unscaled_grads"]
    assert all(inv.precondition is None for inv in invariants)
    by_contract = {inv.params["contract"]: inv.id for inv in invariants}
    run = [_step(0), _step(1, scaled=True), _step(2, restart=True), _step(3, misplaced=True)]
    assert [(v.step, v.invariant) for v in check(invariants, run)] == [
        (1, by_contract["unscaled_grads"]), (2, by_contract["keeps_optimizer_state"])]
    assert check(invariants, [_step(s, misplaced=True) for s in range(4)]) == []


def test_parameters_are_validated_against_the_api_each_contract_is_about():
    template = TEMPLATES["ApiContract"]
    for contract, api in CONTRACTS.items():
        assert template.validate_params({"contract": contract, "api": api}) is None
        assert api in template.describe({"contract": contract, "api": api})
        assert template.hint({"contract": contract, "api": api})
    assert template.validate_params({"contract": "unscaled_grads", "api": MODULE_LOAD_STATE_DICT}) == "api"
    assert template.validate_params({"contract": "nonsense", "api": CLIP_GRAD_NORM}) == "contract"


@pytest.mark.parametrize("contract", sorted(CONTRACTS))
def test_every_contract_names_an_api_the_default_selection_records(contract):
    from producers.interception import recordable
    from producers.selection import DEFAULT_APIS

    assert CONTRACTS[contract] in DEFAULT_APIS and recordable(CONTRACTS[contract])
