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


def _plain(step, *, backward=True, backprop=True, backward_api="torch.Tensor.backward", fed=None):
    from invariants.events import make_batch
    events, cid = [], step * 100
    for api, extra in (("torch.optim.Optimizer.zero_grad", {"obj": "opt0"}), (backward_api, {}),
                       ("torch.optim.Optimizer.step", {"obj": "opt0", "trained": step > 1, "backprop": backprop,
                                                       **({} if fed is None else {"fed": fed})})):
        if api == backward_api and not backward:
            continue
        cid += 2
        base = {"kind": "call", "pid": 1, "tid": 1, "stage": "train", "name": api, "api": api, "cid": cid,
                "parent": None, **extra}
        events += [dict(base, t=cid, phase="pre", args={}, ctx={"grad": True}), dict(base, t=cid + 1, phase="post")]
    events.append({"kind": "step", "t": cid + 50, "pid": 1, "tid": 1, "stage": "train", "phase": "end",
                   "trained": True})
    return make_batch(run="seq", rank=0, world=1, step=step, seq=step, events=events)


def test_steps_of_a_process_that_never_ran_backward_are_not_judged_on_one():
    from invariants.inference import Inferencer
    inferencer = Inferencer(["APISequence"])
    inferencer.add_trace([_plain(s) for s in range(8)])
    rules = [inv for inv in inferencer.finish() if inv.params == {"first": "torch.Tensor.backward",
                                                                   "then": "torch.optim.Optimizer.step"}]
    assert rules
    functional = [_plain(s, backward=False, backprop=False) for s in range(8)]  # torch.func gradients
    assert check(rules, functional) == []
    dropped = [_plain(s, backward=s < 4) for s in range(8)]  # backward forgotten from step 4 on
    assert [v.step for v in check(rules, dropped)] == [4, 5, 6, 7]


def test_a_step_fed_by_a_backward_in_the_previous_window_counts_as_preceded_by_one():
    """Two critics back-propagated, then stepped one after the other: the window boundary
    can fall between a backward and the step it fed, which says ``fed``."""
    from invariants.inference import Inferencer
    inferencer = Inferencer(["APISequence"])
    inferencer.add_trace([_plain(s) for s in range(8)])
    rules = [inv for inv in inferencer.finish() if inv.params == {"first": "torch.Tensor.backward",
                                                                   "then": "torch.optim.Optimizer.step"}]
    assert rules
    assert check(rules, [_plain(s, backward=s < 4, fed=True) for s in range(8)]) == []
    assert [v.step for v in check(rules, [_plain(s, backward=s < 4, fed=s < 4) for s in range(8)])] == [4, 5, 6, 7]


def test_a_backward_run_through_torch_autograd_backward_is_a_backward():
    """Pipeline schedules (``torch.distributed.pipelining``) run each stage's backward
    with ``torch.autograd.backward``: "a backward before every step" holds there."""
    from invariants.inference import Inferencer
    inferencer = Inferencer(["APISequence"])
    inferencer.add_trace([_plain(s) for s in range(8)])
    rules = [inv for inv in inferencer.finish() if inv.params == {"first": "torch.Tensor.backward",
                                                                   "then": "torch.optim.Optimizer.step"}]
    assert rules
    staged = [_plain(s, backward_api="torch.autograd.backward") for s in range(8)]
    assert check(rules, staged) == []
    dropped = [_plain(s, backward=s < 4, backward_api="torch.autograd.backward") for s in range(8)]
    assert [v.step for v in check(rules, dropped)] == [4, 5, 6, 7]
