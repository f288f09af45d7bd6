"""Each relation template, learned from healthy synthetic runs, catches its bug at the right step.

The per-template details live in the sibling ``test_relations_*`` modules; these tests
hold across all of them.
"""

from __future__ import annotations

import pytest

from invariants.engine import Engine
from invariants.invariant_set import InvariantSet
from invariants.synthetic import Fault, SyntheticRun
from tests.support.relation_batches import check, learned


def first_steps(violations, relation: str) -> set[int]:
    return {v.step for v in violations if v.relation == relation}


def test_healthy_run_with_other_seed_and_world_has_no_violation():
    assert check(learned(), SyntheticRun(run="ok", world=4, steps=8, seed=5).batches()) == []


@pytest.mark.parametrize(
    "fault, step, relation",
    [
        ("drift", 4, "Consistent"),
        ("frozen", 4, "EventContain"),
        ("step_noop", 4, "EventContain"),
        ("no_zero_grad", 4, "APISequence"),
        ("dropout_in_eval", 3, "TrainingFlag"),
        ("reinit", 5, "APIAbsent"),
        ("missing_rank", 2, "AllRanksReport"),
        ("same_worker_seed", 3, "APIArg"),
        ("allreduce_shape", 2, "APIArg"),
        ("autocast_lost", 4, "APIOutput"),
        ("untie", 2, "Consistent"),
    ],
)
def test_fault_is_reported_first_at_its_step(fault, step, relation):
    violations = check(learned(), SyntheticRun(run="bad", world=2, steps=8, seed=5, faults=[Fault(fault, step, 1)]).batches())
    assert first_steps(violations, relation), f"{fault}: no {relation} violation"
    assert min(v.step for v in violations) == step
    assert min(first_steps(violations, relation)) == step
    assert all(1 in v.ranks for v in violations if v.step == step and v.relation == relation)


def test_every_template_has_description_and_hint():
    for inv in learned():
        template_hint = Engine(InvariantSet([inv]))  # compiles
        assert inv.description and template_hint
