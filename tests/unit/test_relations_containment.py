"""EventContain: what a call must do to the state it touches (optimizer steps update,
zero_grad clears) and which calls it must contain, with the context that learned it."""

from __future__ import annotations

from invariants.synthetic import Fault, SyntheticRun
from tests.support.relation_batches import check, find, learned


def test_optimizer_step_changes_only_params_with_grad_by_learned_precondition():
    inv = find("EventContain", form="state", api="torch.optim.Optimizer.step", effect="changes")
    clauses = [c for conj in inv.precondition["any"] for c in conj["all"]]
    assert {"kind": "constant", "field": "has_grad", "values": [True]} in clauses or \
        {"kind": "constant", "field": "requires_grad", "values": [True]} in clauses
    # the frozen parameter never changes and is not reported
    assert check([inv], SyntheticRun(run="ok", steps=5, seed=3).batches()) == []
    violations = check([inv], SyntheticRun(run="bad", steps=5, faults=[Fault("frozen", 3, 0)]).batches())
    assert {(v.step, v.evidence["first"]["variable"]) for v in violations} == {(3, "module.fc1.weight"), (4, "module.fc1.weight")}


def _optimizer_step_snapshots(batches, step, update):
    """Apply ``update(attrs, at)`` to every snapshot around ``Optimizer.step`` at ``step``."""
    for batch in batches:
        if batch["step"] != step:
            continue
        for event in batch["events"]:
            if event["kind"] == "state" and event["at"].endswith(":torch.optim.Optimizer.step"):
                update(event["attrs"], event["at"])
    return batches


def test_optimizer_step_changes_some_parameter_per_call():
    inv = find("EventContain", form="state", api="torch.optim.Optimizer.step", effect="changes_some")
    # one frozen parameter (and the never-trained one) is not a call that updates nothing
    assert check([inv], SyntheticRun(run="ok", steps=5, faults=[Fault("frozen", 2, 0)]).batches()) == []
    violations = check([inv], SyntheticRun(run="bad", world=2, steps=5, faults=[Fault("step_noop", 3, 1)]).batches())
    assert [(v.step, v.ranks) for v in violations] == [(3, [1]), (4, [1])]
    assert violations[0].evidence["first"]["with_significant_gradient"] == 6


def test_optimizer_step_that_changes_nothing_without_any_gradient_is_reported():
    inv = find("EventContain", form="state", api="torch.optim.Optimizer.step", effect="changes_some")
    # an optimizer over parameters that never receive a gradient: nothing moves
    batches = list(SyntheticRun(run="bad", world=1, steps=4, faults=[Fault("step_noop", 2, 0)]).batches())

    def no_grad(attrs, at):
        attrs.update(grad_digest=None, grad_norm=None, requires_grad=False)

    violations = check([inv], _optimizer_step_snapshots(batches, 2, no_grad))
    assert [v.step for v in violations][:1] == [2]
    assert violations[0].evidence["first"]["with_gradient"] == 0


def test_a_step_without_gradients_before_any_backward_is_not_judged():
    """A framework still steps for a batch its training step skipped before anything was
    back-propagated (Lightning when ``training_step`` returns None): no update is due."""
    inv = find("EventContain", form="state", api="torch.optim.Optimizer.step", effect="changes_some")
    batches = list(SyntheticRun(run="skip", world=1, steps=4, faults=[Fault("step_noop", 2, 0)]).batches())

    def no_grad(attrs, at):
        attrs.update(grad_digest=None, grad_norm=None)

    def before_any_backward(batch):
        for event in batch["events"]:
            if event["kind"] == "call" and event.get("api") == "torch.optim.Optimizer.step":
                event["backprop"] = False
        return batch

    batches = _optimizer_step_snapshots(batches, 2, no_grad)
    assert [v.step for v in check([inv], batches)][:1] == [2]
    assert [v.step for v in check([inv], [before_any_backward(b) if b["step"] == 2 else b for b in batches])][:1] == [3]


def test_an_optimizers_first_step_that_changes_nothing_is_not_judged():
    """A warm-up from 0 computed inside the optimizer's own update (BertAdam) leaves the
    groups' ``lr`` positive and updates nothing at the optimizer's first step; an
    optimizer that never updates anything is reported at its second."""
    inv = find("EventContain", form="state", api="torch.optim.Optimizer.step", effect="changes_some")
    batches = list(SyntheticRun(run="warm", world=1, steps=5, faults=[Fault("step_noop", 2, 0)]).batches())
    first = [v.step for v in check([inv], batches)][0]

    def first_step_of_a_new_optimizer(batch):
        for event in batch["events"]:
            if event["kind"] == "call" and event.get("api") == "torch.optim.Optimizer.step":
                event["trained"] = False
        return batch

    marked = [first_step_of_a_new_optimizer(b) if b["step"] == first else b for b in batches]
    assert [v.step for v in check([inv], marked)][:1] == [first + 1]

    def no_grad(attrs, at):  # an optimizer over parameters frozen by mistake: no gradient at all
        attrs.update(grad_digest=None, grad_norm=None, requires_grad=False)

    frozen = _optimizer_step_snapshots(marked, first, no_grad)
    assert [v.step for v in check([inv], frozen)][:1] == [first]


def test_optimizer_step_with_only_vanishing_gradients_is_not_judged():
    inv = find("EventContain", form="state", api="torch.optim.Optimizer.step", effect="changes_some")
    batches = list(SyntheticRun(run="tiny", world=1, steps=4, faults=[Fault("step_noop", 2, 0)]).batches())

    def vanishing(attrs, at):  # gradients ~1e-7 of the weights (conv bias before BatchNorm)
        if attrs.get("grad_norm") is not None:
            attrs["grad_norm"] = 1e-7

    # the step from 2 on updates nothing; at step 2 every gradient was too small to move the weights
    assert [v.step for v in check([inv], _optimizer_step_snapshots(batches, 2, vanishing))] == [3]


def test_zero_grad_clears_gradients():
    inv = find("EventContain", form="state", api="torch.optim.Optimizer.zero_grad", effect="cleared")
    run = SyntheticRun(run="ok", world=1, steps=3)
    batches = list(run.batches())
    for batch in batches:  # zero_grad that leaves one gradient in place
        for event in batch["events"]:
            if event.get("at") == "post:torch.optim.Optimizer.zero_grad" and event["name"] == "module.fc2.bias" and batch["step"] == 2:
                event["attrs"]["grad_digest"] = "abcd"
                event["attrs"]["grad_norm"] = 0.3
    violations = check([inv], batches)
    assert [(v.step, v.evidence["first"]["variable"]) for v in violations] == [(2, "module.fc2.bias")]


def test_call_containment_with_argument_value_and_stage_precondition():
    plain = [i for i in learned() if i.relation == "EventContain" and i.params.get("mtype") == "Dropout"
             and i.params.get("child") == "torch.nn.functional.dropout" and "args" not in i.params]
    assert plain and not any(c["kind"] == "constant" and c["field"] == "mtype"
                             for conj in (plain[0].precondition or {"any": []})["any"] for c in conj["all"])
    with_args = [i for i in learned() if i.relation == "EventContain" and i.params.get("mtype") == "Dropout"
                 and i.params.get("args") == {"training": False}]
    assert with_args
    assert {"kind": "constant", "field": "stage", "values": ["eval"]} in with_args[0].precondition["any"][0]["all"]
    violations = check(with_args, SyntheticRun(run="bad", steps=7, faults=[Fault("dropout_in_eval", 6, 1)]).batches())
    assert [(v.step, v.ranks) for v in violations] == [(6, [1])]
