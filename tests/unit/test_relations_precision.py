"""StablePrecision: a module's training forwards keep a dtype of its previous training
iteration; the setup window, windows without an update, evaluation and no-grad passes
neither judge nor teach, new modules and models start their own baseline, one change is
reported once, and the baseline survives the run state's round trip."""

from __future__ import annotations

from invariants.engine import RunState
from invariants.events import MODULE_FORWARD, OPTIMIZER_STEP, make_batch
from invariants.inference import Inferencer
from invariants.relations import TEMPLATES
from invariants.relations.precision import MAX_BASELINE_MODULES, learn_precisions, output_dtype
from invariants.relations.view import WindowView
from invariants.window import FactPlan, WindowState
from tests.support.relation_batches import check

T = {"T": "tensor", "shape": [8, 4], "device": "cpu", "requires_grad": True}


def _forward(cid, path, dtype, *, model="m0", training=True, grad=True, mtype="Linear", autocast=None):
    base = {"kind": "call", "pid": 1, "tid": 1, "stage": "train", "name": f"torch.nn.{mtype}.forward",
            "api": MODULE_FORWARD, "cid": cid, "parent": None, "module": path, "mtype": mtype, "training": training}
    ctx = {"grad": grad, "autocast": autocast or ("bfloat16" if dtype == "bfloat16" else None), "training": training}
    out = dict(T, dtype=dtype)
    return [dict(base, t=cid, phase="pre", obj=model, args={"0": dict(T, dtype="float32")}, ctx=ctx),
            dict(base, t=cid + 1, phase="post", ret=out if dtype else [{"T": "tensor", "dtype": "int64"}])]


def _step(step, dtype="bfloat16", *, extra=(), model="m0", eval_fp32=True, trained=True, autocast=None):
    cid = step * 100
    events = (_forward(cid + 1, "", dtype, model=model, autocast=autocast)
              + _forward(cid + 3, "fc", dtype, model=model, autocast=autocast))
    if eval_fp32:  # evaluation and no-grad passes run in float32: they judge nothing
        events += _forward(cid + 5, "fc", "float32", model=model, training=False, grad=False)
        events += _forward(cid + 7, "fc", "float32", model=model, training=True, grad=False)
    for offset, (path, out, owner, *mtype) in enumerate(extra):
        events += _forward(cid + 20 + 2 * offset, path, out, model=owner, mtype=mtype[0] if mtype else "Linear")
    end = {"kind": "step", "t": cid + 90, "pid": 1, "tid": 1, "stage": "train", "phase": "end"}
    events.append(dict(end, trained=True) if trained else end)
    return make_batch(run="precision", rank=0, world=1, step=step, seq=step, events=events)


def _healthy(steps=5):
    # step 0 is the setup window: a dry-run forward in float32 before autocast is set up
    return [_step(0, "float32")] + [_step(s) for s in range(1, steps)]


def _inferred():
    inferencer = Inferencer(["StablePrecision"])
    inferencer.add_trace(_healthy())
    return inferencer.finish()


def test_a_precision_kept_in_the_references_is_learned_without_precondition():
    invariants = _inferred()
    assert [inv.params for inv in invariants] == [{"api": MODULE_FORWARD, "prop": "dtype"}]
    assert invariants[0].precondition is None
    assert check(invariants, _healthy(8)) == []


def test_autocast_dropped_mid_run_is_reported_at_its_first_step_with_the_modules_that_changed():
    invariants = _inferred()
    run = _healthy(4) + [_step(4, "float32"), _step(5, "float32")]
    violations = check(invariants, run)
    assert [v.step for v in violations] == [4]  # a change is reported once, where it happens
    evidence = violations[0].evidence
    assert evidence["first"] == {"module": "(the model itself)", "model": "m0", "dtypes": ["float32"],
                                 "previous_iteration": ["bfloat16"]}
    assert evidence["sites"] == 2


def test_windows_without_an_update_neither_judge_nor_teach():
    invariants = _inferred()
    # a float32 pass in a window no update ended (a sloppy validation in train mode)
    run = _healthy(3) + [_step(3, "float32", trained=False), _step(4), _step(5)]
    assert check(invariants, run) == []


def test_a_module_also_run_in_another_precision_on_purpose_keeps_a_dtype():
    invariants = _inferred()
    aux = [("fc", "float32", "m0")]  # a float32 auxiliary pass next to the autocast one
    run = _healthy(3) + [_step(3, extra=aux), _step(4), _step(5, extra=aux)]
    assert check(invariants, run) == []


def test_one_layer_losing_autocast_while_the_others_keep_it_is_reported():
    invariants = _inferred()
    extra_ok = [("act", "bfloat16", "m0", "ReLU")]
    extra_bad = [("act", "float32", "m0", "ReLU")]
    run = [_step(0, "float32")] + [_step(s, extra=extra_ok) for s in (1, 2)] + [_step(3, extra=extra_bad)]
    violations = check(invariants, run)
    assert [(v.step, v.evidence["first"]["module"]) for v in violations] == [(3, "act")]


def test_mixed_precision_switched_on_after_a_float32_warm_up_is_not_a_loss_but_a_cast_of_the_weights_is():
    invariants = _inferred()
    warm_up = [_step(0, "float32")] + [_step(s, "float32") for s in (1, 2, 3)]
    switched_on = [_step(s, "float16", autocast="float16") for s in (4, 5)]
    assert check(invariants, warm_up + switched_on) == []
    halved = [_step(s, "float16") for s in (4, 5)]  # model.half(): float16 outside any autocast region
    assert [v.step for v in check(invariants, warm_up + halved)] == [4]


def test_a_new_phase_with_a_fresh_optimizer_may_choose_its_precision():
    invariants = _inferred()
    first_step = {"kind": "call", "pid": 1, "tid": 1, "stage": "train", "name": "torch.optim.SGD.step",
                  "api": OPTIMIZER_STEP, "cid": 480, "parent": None, "obj": "opt1", "trained": False}
    new_phase = _step(4, "float32")
    new_phase["events"][-1:-1] = [dict(first_step, t=480, phase="pre"), dict(first_step, t=481, phase="post")]
    run = _healthy(4) + [new_phase, _step(5, "float32")]
    assert check(invariants, run) == []
    assert [v.step for v in check(invariants, _healthy(4) + [_step(4, "float32")])] == [4]


def test_modules_and_models_first_trained_later_set_their_own_baseline():
    invariants = _inferred()
    # a head grown at step 3 in float32, a second model (a sweep's next trial) in float32
    grown = [("head", "float32", "m0")]
    run = _healthy(3) + [_step(3, extra=grown), _step(4, extra=grown),
                         _step(5, "float32", model="m1"), _step(6, "float32", model="m1")]
    assert check(invariants, run) == []


def test_integer_outputs_are_not_precision():
    assert output_dtype({"T": "tensor", "dtype": "int64"}) is None
    assert output_dtype([{"T": "obj", "type": "X"}, [{"T": "tensor", "dtype": "float16"}]]) == "float16"
    assert output_dtype([[[{"T": "tensor", "dtype": "float16"}]]]) is None  # deeper than searched
    invariants = _inferred()
    run = _healthy(3) + [_step(3, extra=[("ids", None, "m0")]), _step(4, extra=[("ids", None, "m0")])]
    assert check(invariants, run) == []


def _window(batch) -> WindowState:
    window = WindowState(batch["run"], batch["step"])
    window.add_batch(batch, FactPlan.everything())
    return window


def test_the_baseline_is_bounded_and_survives_the_run_state_round_trip():
    baseline = {f"m0|layer{i}": ["bfloat16"] for i in range(MAX_BASELINE_MODULES)}
    learn_precisions(WindowView(_window(_step(1, extra=[("new", "float32", "m0")]))), baseline)
    assert len(baseline) == MAX_BASELINE_MODULES and "m0|new" not in baseline
    learn_precisions(WindowView(_window(_step(2, "float32", extra=[("layer7", "float32", "m0")]))),
                     baseline)
    assert baseline["m0|layer7"] == ["float32"]  # known modules still move on
    state = RunState("precision")
    learn_precisions(WindowView(_window(_step(1))), state.precisions)
    assert state.precisions == {"m0|": ["bfloat16"], "m0|fc": ["bfloat16"]}
    assert RunState.from_bytes(state.to_bytes()).precisions == state.precisions
    learn_precisions(WindowView(_window(_step(0, "float32"))), state.precisions)  # setup: ignored
    learn_precisions(WindowView(_window(_step(2, "float32", trained=False))), state.precisions)
    assert state.precisions["m0|fc"] == ["bfloat16"]


def test_parameters_are_validated():
    template = TEMPLATES["StablePrecision"]
    assert template.validate_params({"api": MODULE_FORWARD, "prop": "dtype"}) is None
    assert template.validate_params({"api": "torch.nn.functional.linear", "prop": "dtype"}) == "api"
    assert template.validate_params({"api": MODULE_FORWARD, "prop": "shape"}) == "prop"
