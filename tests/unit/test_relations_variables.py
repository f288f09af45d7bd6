"""Rules about a run's set of variables: tied names stay aliases of one tensor
(Consistent over aliases) and the set an optimizer steps stays the same (StableVariables)."""

from __future__ import annotations

from invariants.engine import Engine
from invariants.invariant_set import InvariantSet
from invariants.synthetic import Fault, SyntheticRun
from tests.support.relation_batches import check, find


def test_variable_set_change_mid_run_is_reported():
    inv = find("StableVariables", at="post:torch.optim.Optimizer.step")
    assert check([inv], SyntheticRun(run="ok", world=2, steps=5, seed=4).batches()) == []
    batches = list(SyntheticRun(run="grown", world=2, steps=5, seed=4).batches())
    for batch in batches:  # from step 3 rank 1's optimizer also steps a new parameter
        if batch["step"] >= 3 and batch["rank"] == 1:
            extra = [dict(e, name="module.new.weight") for e in batch["events"]
                     if e["kind"] == "state" and e["name"] == "module.fc1.weight"]
            batch["events"] = batch["events"][:-1] + extra + batch["events"][-1:]
    violations = check([inv], batches)
    assert [(v.step, v.ranks) for v in violations] == [(3, [1]), (4, [1])]
    first = violations[0].evidence["first"]
    assert first["count_at_step_0"] == 7 and first["count"] == 8 and "module.new.weight" in first["names"]


def test_ties_reported_at_step_zero_keep_holding_whatever_the_names():
    inv = find("Consistent", scope="aliases", at="step_end", attr="data_digest")
    assert inv.precondition is None
    assert check([inv], SyntheticRun(run="ok", world=2, steps=5, seed=4).batches()) == []
    violations = check([inv], SyntheticRun(run="bad", world=2, steps=5, faults=[Fault("untie", 2, 0)]).batches())
    assert [v.step for v in violations] == [2, 3, 4]
    broken = violations[0].evidence["first"]["broken"][0]
    assert (broken["alias"], broken["of"], broken["still_reported_as_alias"]) == ("module.head.weight", "module.embed.weight", False)


def test_tie_baseline_survives_run_state_serialisation():
    from invariants.engine import RunState

    inv = find("Consistent", scope="aliases", at="step_end", attr="data_digest")
    engine = Engine(InvariantSet([inv]))
    batches = list(SyntheticRun(run="bad", world=1, steps=4, faults=[Fault("untie", 2, 0)]).batches())
    state = RunState("bad")
    found = []
    for step in range(4):
        window = engine.new_window("bad", step)
        for batch in batches:
            if batch["step"] == step:
                engine.add_batch(window, batch)
        found += engine.evaluate(window, state)
        state = RunState.from_bytes(state.to_bytes())
    assert state.ties == [["module.head.weight", "module.embed.weight"]]
    assert [v.step for v in found] == [2, 3]
