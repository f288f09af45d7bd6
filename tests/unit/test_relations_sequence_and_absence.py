"""Call-order templates: APISequence keeps only top-level calls, APIAbsent keeps the
training loop out of evaluation."""

from __future__ import annotations

from invariants.relations import TEMPLATES
from invariants.synthetic import SyntheticRun
from tests.support.relation_batches import check, find, learned


def test_sequence_rules_are_pruned_to_top_level_calls():
    sequences = [inv for inv in learned() if inv.relation == "APISequence"]
    assert any(inv.params == {"first": "torch.optim.Optimizer.zero_grad", "then": "torch.optim.Optimizer.step"} for inv in sequences)
    nested = {"torch.nn.functional.linear", "torch.nn.functional.dropout", "torch.distributed.all_reduce"}
    assert not any(inv.params["first"] in nested or inv.params["then"] in nested for inv in sequences)


def test_training_loop_api_absent_from_eval_stage():
    inv = find("APIAbsent", api="torch.optim.Optimizer.step", stage="eval")
    assert inv.params["after_step"] == -1
    batches = list(SyntheticRun(run="bad", world=2, steps=6, seed=5).batches())
    for batch in batches:  # model left in eval: the producer reports the eval stage while training
        if batch["step"] == 4 and batch["rank"] == 0:
            for event in batch["events"]:
                if event["kind"] == "call" and event["api"] == "torch.optim.Optimizer.step":
                    event["stage"] = "eval"
    violations = [v for v in check([inv], batches)]
    assert [(v.step, v.ranks, v.stage) for v in violations] == [(4, [0], "eval")]


def test_the_hint_of_a_training_call_in_evaluation_points_at_eval_mode_left_on():
    template = TEMPLATES["APIAbsent"]
    left_on = template.hint({"api": "torch.optim.Optimizer.step", "stage": "eval", "after_step": -1})
    assert "model.train()" in left_on and "seeding" not in left_on
    again = template.hint({"api": "torch.nn.init.normal_", "stage": "train", "after_step": 0})
    assert "re-initialised" in again
