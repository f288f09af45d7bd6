"""TrainingFlag: spectral-norm layers first run in training mode, and dropout without
gradients runs in evaluation mode."""

from __future__ import annotations

from invariants.events import make_batch
from invariants.inference import Inferencer
from tests.support.relation_batches import check


def _first_forwards_batch(step: int, forwards: list[tuple[str, bool, dict]], *, stage: str = "train") -> dict:
    """Module forward pre/post pairs: (module path, training flag, extra ctx)."""
    events = []
    for index, (module, training, extra) in enumerate(forwards):
        cid = step * 100 + index + 1
        base = {"kind": "call", "pid": 1, "tid": 1, "stage": stage, "name": "Linear.forward",
                "api": "torch.nn.Module.forward", "cid": cid, "parent": None, "module": module, "mtype": "Linear",
                "training": training}
        ctx = {"grad": stage == "train", "autocast": None, "training": stage == "train", **extra}
        events.append(dict(base, t=cid * 2, phase="pre", ctx=ctx, args={}))
        events.append(dict(base, t=cid * 2 + 1, phase="post", ret=None))
    events.append({"kind": "step", "t": step * 1000 + 999, "pid": 1, "tid": 1, "stage": stage, "phase": "end"})
    return make_batch(run="sn", rank=0, world=1, step=step, seq=step, events=events)


FIRST = {"first_forward": True}


SN_HOOK = {"first_forward": True, "spectral_norm": "hook"}


SPECTRAL_FIRST_FORWARD = {"api": "torch.nn.Module.forward", "first_forward": True, "spectral_norm": "hook",
                          "training": True}


def _sngan_reference():
    """Spectral-norm layers first run in training mode; evaluation passes come later."""
    yield _first_forwards_batch(0, [("d.0", True, SN_HOOK), ("d.2", True, SN_HOOK), ("g.0", True, FIRST)])
    yield _first_forwards_batch(1, [("d.0", False, {}), ("d.2", False, {}), ("g.0", False, {})], stage="eval")
    yield _first_forwards_batch(2, [("d.0", True, {}), ("d.2", True, {}), ("late", True, SN_HOOK)])


def test_spectral_norm_layers_first_forward_in_training_mode_in_any_stage():
    inferencer = Inferencer(["TrainingFlag"])
    inferencer.add_trace(_sngan_reference())
    rules = [i for i in inferencer.finish() if i.params.get("first_forward")]
    assert [(i.params, i.precondition) for i in rules] == [(SPECTRAL_FIRST_FORWARD, None)]
    from invariants.relations import TEMPLATES

    assert "first forward" in rules[0].description and "sigma" in TEMPLATES["TrainingFlag"].hint(rules[0].params)
    # a layer grown at step 2 and first run by an eval-mode sanity pass under no_grad
    buggy = [_first_forwards_batch(0, [("d.0", True, SN_HOOK)]),
             _first_forwards_batch(1, [("d.0", True, {})]),
             _first_forwards_batch(2, [("grown", False, SN_HOOK), ("d.0", False, {})], stage="eval"),
             _first_forwards_batch(3, [("grown", True, {}), ("d.0", True, {})])]
    violations = check(rules, buggy)
    assert [(v.step, v.evidence["first"]["module"]) for v in violations] == [(2, "grown")]
    # eval-first modules without spectral norm (a frozen backbone), the parametrization-based
    # implementation (refined when registered) and layers resumed from a checkpoint are not judged
    others = [_first_forwards_batch(0, [("backbone", False, FIRST),
                                        ("head", False, {"first_forward": True, "spectral_norm": "parametrization"}),
                                        ("disc", False, dict(SN_HOOK, spectral_norm_refined=True))],
                                    stage="eval")]
    assert check(rules, others) == []


def test_first_forward_rule_params_are_validated():
    from invariants.relations import TEMPLATES

    flag = TEMPLATES["TrainingFlag"]
    assert flag.validate_params(SPECTRAL_FIRST_FORWARD) is None
    assert flag.validate_params({k: v for k, v in SPECTRAL_FIRST_FORWARD.items() if k != "spectral_norm"}) == "spectral_norm"
    assert flag.validate_params(dict(SPECTRAL_FIRST_FORWARD, first_forward="yes")) == "first_forward"
    assert flag.validate_params(dict(SPECTRAL_FIRST_FORWARD, training="true")) == "training"


def test_first_forward_rule_is_not_learned_from_an_eval_first_reference():
    inferencer = Inferencer(["TrainingFlag"])
    inferencer.add_trace([_first_forwards_batch(0, [("a", False, SN_HOOK), ("b", False, SN_HOOK)], stage="eval"),
                          _first_forwards_batch(1, [("a", True, {}), ("b", True, {})])])
    assert not [i for i in inferencer.finish() if i.params.get("first_forward")]


def test_first_forward_facts_are_not_precondition_fields_of_other_rules():
    from invariants.relations.view import WindowView
    from invariants.window import FactPlan, WindowState

    window = WindowState("sn", 0)
    window.add_batch(_first_forwards_batch(0, [("d.0", True, SN_HOOK)]), FactPlan.everything())
    view = WindowView(window)
    record = view.call_record(view.calls(0)[0], 0)
    assert record["ctx.grad"] is True and not {"ctx.first_forward", "ctx.spectral_norm"} & set(record)


DROPOUT = "torch.nn.functional.dropout"


NO_GRAD_DROPOUT = {"api": DROPOUT, "grad": False, "training": False}


def _dropout_batch(step: int, passes: list[tuple[bool, bool, str]]) -> dict:
    """F.dropout pre/post pairs: (grad enabled, training flag, stage); the enclosing
    module's mode (``ctx.training``) follows the stage, as with ``eval()``."""
    events = []
    for index, (grad, training, stage) in enumerate(passes):
        cid = step * 100 + index + 1
        base = {"kind": "call", "pid": 1, "tid": 1, "stage": stage, "name": DROPOUT, "api": DROPOUT, "cid": cid,
                "parent": None}
        events.append(dict(base, t=cid * 2, phase="pre", ctx={"grad": grad, "autocast": None,
                                                               "training": stage == "train"},
                           args={"training": training}))
        events.append(dict(base, t=cid * 2 + 1, phase="post", ret=None))
    events.append({"kind": "step", "t": step * 1000 + 999, "pid": 1, "tid": 1, "stage": "train", "phase": "end"})
    return make_batch(run="dropout", rank=0, world=1, step=step, seq=step, events=events)


def _no_grad_rules(reference) -> list:
    inferencer = Inferencer(["TrainingFlag"])
    inferencer.add_trace(reference)
    return [i for i in inferencer.finish() if i.params.get("grad") is False]


def test_dropout_without_gradients_runs_in_evaluation_mode_whatever_the_stage():
    """An evaluation pass that forgets ``model.eval()`` stays in stage 'train' (nothing
    switched it), so only the missing gradients say it evaluates."""
    reference = [_dropout_batch(s, [(True, True, "train"), (True, True, "train"), (False, False, "eval")])
                 for s in range(4)]
    rules = _no_grad_rules(reference)
    assert [r.params for r in rules] == [NO_GRAD_DROPOUT]
    assert "stage" not in str(rules[0].precondition) and "ctx.training" not in str(rules[0].precondition)
    assert "gradients are disabled" in rules[0].description
    assert check(rules, reference) == []
    forgot_eval = [_dropout_batch(0, [(True, True, "train")]), _dropout_batch(1, [(False, True, "train")])]
    assert [v.step for v in check(rules, forgot_eval)] == [1]
    assert check(rules, [_dropout_batch(0, [(True, True, "train"), (True, True, "eval")])]) == []


def test_no_grad_dropout_rule_is_not_learned_when_a_reference_drops_without_gradients():
    monte_carlo = [_dropout_batch(s, [(True, True, "train"), (False, True, "eval"), (False, False, "eval")])
                   for s in range(4)]
    assert _no_grad_rules(monte_carlo) == []


def test_no_grad_dropout_rule_params_are_validated():
    from invariants.relations import TEMPLATES

    flag = TEMPLATES["TrainingFlag"]
    assert flag.validate_params(NO_GRAD_DROPOUT) is None
    assert flag.validate_params(dict(NO_GRAD_DROPOUT, grad=True)) == "grad"
    assert flag.validate_params(dict(NO_GRAD_DROPOUT, stage="eval")) == "grad"
