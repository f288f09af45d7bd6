"""Rules about objects, not API names: per-optimizer ordering, equivalent clears, trained
parameters, torch layers versus user classes, and the template fixes that keep
hyperparameters, unbatched inputs and one program's habits out of the inferred laws."""

from __future__ import annotations

import torch
import torch.nn.parallel

from invariants.events import make_batch
from invariants.inference import Inferencer
from invariants.relations.identity import TORCH_NN_MODULES, keyed_on_user_class
from invariants.window import FactPlan, WindowState
from tests.support.relation_batches import check

STEP, OPT_ZERO, MOD_ZERO, BACKWARD = ("torch.optim.Optimizer.step", "torch.optim.Optimizer.zero_grad",
                                      "torch.nn.Module.zero_grad", "torch.Tensor.backward")
ZERO_BEFORE_STEP = {"first": OPT_ZERO, "then": STEP}


def call(api: str, **fields) -> dict:
    return {"api": api, **fields}


def window_batch(step: int, calls: list[dict], *, run: str = "r", stage: str = "train") -> dict:
    """One rank's step: each call a top-level pre/post pair with the given extra fields."""
    events = []
    for index, spec in enumerate(calls):
        cid = step * 100 + index + 1
        fields = {k: v for k, v in spec.items() if k not in ("api", "args", "ret", "stage")}
        base = {"kind": "call", "pid": 1, "tid": 1, "stage": spec.get("stage", stage), "name": spec["api"],
                "api": spec["api"], "cid": cid, "parent": None, "ctx": {}, **fields}
        events.append(dict(base, t=cid * 2, phase="pre", args=spec.get("args", {})))
        events.append(dict(base, t=cid * 2 + 1, phase="post", ret=spec.get("ret")))
    events.append({"kind": "step", "t": step * 1000 + 999, "pid": 1, "tid": 1, "stage": stage, "phase": "end"})
    return make_batch(run=run, rank=0, world=1, step=step, seq=step, events=events)


def learn(relations: list[str], *traces) -> list:
    inferencer = Inferencer(relations)
    for trace in traces:
        inferencer.add_trace(trace)
    return inferencer.finish()


def two_optimizer_loop(steps: int, *, skip_second_zero_grad_at: int = -1, ids: bool = True, run: str = "gan"):
    """A GAN-like loop: each optimizer's zero_grad, backward, step (ids as producers give them)."""
    def obj(name: str) -> dict:
        return {"obj": name} if ids else {}

    for step in range(steps):
        calls = [call("torch.nn.Module.forward", mtype="Linear")]
        calls += [call(OPT_ZERO, **obj("opt0")), call(BACKWARD), call(STEP, **obj("opt0"))]
        if step != skip_second_zero_grad_at:
            calls.append(call(OPT_ZERO, **obj("opt1")))
        calls += [call(BACKWARD), call(STEP, **obj("opt1"))]
        yield window_batch(step, calls, run=run)


# ------------------------------------------------------------------ the fields reach the window
def test_receiver_ids_clears_and_trained_flag_are_kept_in_the_window():
    batch = window_batch(1, [call(MOD_ZERO, obj="m0", clears=["opt0", "opt1"]), call(STEP, obj="opt0"),
                             call("torch.nn.init.normal_", trained=True), call(BACKWARD, obj=7, clears="opt0")])
    window = WindowState("r", 1)
    window.add_batch(batch, FactPlan.everything())
    calls = window.ranks[0].calls
    assert [(c.get("obj"), c.get("clears"), c.get("trained")) for c in calls] == [
        ("m0", ["opt0", "opt1"], None), ("opt0", None, None), (None, None, True),
        (None, None, None),  # ids of the wrong type are unknown, like missing ones
    ]


# ------------------------------------------------------------------ per-optimizer ordering
def test_zero_grad_of_one_optimizer_does_not_clear_another():
    rules = [i for i in learn(["APISequence"], two_optimizer_loop(6)) if i.params == ZERO_BEFORE_STEP]
    assert len(rules) == 1
    assert check(rules, two_optimizer_loop(6, run="ok")) == []
    violations = check(rules, two_optimizer_loop(6, skip_second_zero_grad_at=3, run="bad"))
    assert [(v.step, v.evidence["first"].get("optimizers")) for v in violations] == [(3, ["opt1"])]


def test_traces_without_receiver_ids_keep_api_level_ordering():
    rules = [i for i in learn(["APISequence"], two_optimizer_loop(6, ids=False)) if i.params == ZERO_BEFORE_STEP]
    assert len(rules) == 1
    # without ids any zero_grad counts, as before: the first optimizer's hides the second's
    assert check(rules, two_optimizer_loop(6, skip_second_zero_grad_at=3, ids=False, run="old")) == []


def _single_optimizer_loop(steps: int, clear: dict | None, *, run: str):
    for step in range(steps):
        calls = [call("torch.nn.Module.forward", mtype="Linear"), call(BACKWARD), call(STEP, obj="opt0")]
        if clear is not None:
            calls.insert(0, clear)
        yield window_batch(step, calls, run=run)


def test_module_zero_grad_over_the_optimizers_parameters_is_its_zero_grad():
    rules = [i for i in learn(["APISequence"], _single_optimizer_loop(6, call(OPT_ZERO, obj="opt0"), run="ref"))
             if i.params["first"] == OPT_ZERO]
    assert {i.params["then"] for i in rules} >= {STEP, BACKWARD}
    trainer_style = call(MOD_ZERO, obj="m0", clears=["opt0"])  # model.zero_grad(), as HF Trainer does
    assert check(rules, _single_optimizer_loop(6, trainer_style, run="hf")) == []
    # a module that holds only part of the optimizer's parameters clears none of its gradients
    partial = call(MOD_ZERO, obj="m1", clears=[])
    # (step 1, the first iteration, is not judged: nothing before it left gradients)
    partial_violations = check(rules, _single_optimizer_loop(4, partial, run="part"))
    assert {v.step for v in partial_violations} == {2, 3}
    # ... but it clears gradients before a backward, which is about no optimizer (a loop
    # without an optimizer clears with Module.zero_grad over parameters no optimizer holds)
    assert {v.evidence["first"]["then"] for v in partial_violations} == {STEP}
    other = call(MOD_ZERO, obj="m1", clears=["opt1"])
    violations = [v for v in check(rules, _single_optimizer_loop(4, other, run="other")) if v.step == 2]
    assert [v.evidence["first"]["then"] for v in violations] == [STEP]  # backward names no optimizer


# ------------------------------------------------------------------ module types
def test_the_torch_layer_list_is_the_installed_torchs():
    installed = {obj.__name__ for space in (torch.nn, torch.nn.parallel) for obj in vars(space).values()
                 if isinstance(obj, type) and issubclass(obj, torch.nn.Module)}
    assert TORCH_NN_MODULES == installed


def test_no_inferred_rule_is_keyed_on_a_user_class_or_a_container():
    def forwards(step):
        tensor = {"T": "tensor", "shape": [8, 4], "dtype": "torch.float32"}
        return window_batch(step, [call("torch.nn.Module.forward", mtype=mtype, training=True, args={"0": tensor},
                                        ret=tensor) for mtype in ("Net", "Sequential", "LayerNorm")])

    invariants = learn(["APIOutput", "TrainingFlag", "EventContain"], [forwards(s) for s in range(5)])
    keyed = {i.params.get("mtype") for i in invariants}
    assert "LayerNorm" in keyed and not keyed & {"Net", "Sequential"}
    assert keyed_on_user_class({"mtype": "DistributedDataParallel"}) and not keyed_on_user_class({"mtype": "Conv2d"})


# ------------------------------------------------------------------ initialisation of trained parameters
def _init_run(run: str, mid_run: dict | None = None, at: int = 3):
    yield window_batch(0, [call("torch.nn.init.normal_", trained=False, stage="init"),
                           call("torch.Tensor.param_overwrite", trained=False, stage="init")], stage="init")
    for step in range(1, 7):
        calls = [call(BACKWARD), call(STEP, obj="opt0")]
        if mid_run is not None and step == at:
            calls.insert(0, mid_run)
        yield window_batch(step, calls, run=run)


def test_reinitialising_trained_parameters_is_reported_but_building_a_new_model_is_not():
    rules = [i for i in learn(["APIAbsent"], _init_run("ref")) if i.params["stage"] == "train"]
    assert {i.params["api"] for i in rules} >= {"torch.nn.init.normal_", "torch.Tensor.param_overwrite"}
    new_model = call("torch.nn.init.normal_", trained=False)
    assert check(rules, _init_run("new", new_model)) == []
    for api in ("torch.nn.init.normal_", "torch.Tensor.param_overwrite"):
        violations = check(rules, _init_run("re", call(api, trained=True)))
        assert [(v.step, v.invariant) for v in violations] == [
            (3, next(i.id for i in rules if i.params["api"] == api))]
    # older producers say nothing about the target: judged as before
    assert [v.step for v in check(rules, _init_run("old", call("torch.nn.init.normal_")))] == [3]


def test_a_reference_that_builds_a_new_model_mid_run_still_teaches_the_rule():
    rules = learn(["APIAbsent"], _init_run("ref", call("torch.nn.init.normal_", trained=False), at=2),
                  _init_run("ref2", call("torch.nn.init.normal_", trained=False), at=4))
    assert any(i.params == {"api": "torch.nn.init.normal_", "stage": "train", "after_step": -1} for i in rules)


# ------------------------------------------------------------------ template fixes
def test_batch_size_is_judged_only_where_the_input_holds_a_batch():
    def policy(step, out_rows):
        # an RL policy fed one 1-D state, then a batched update of 2-D states
        state = {"T": "tensor", "shape": [4], "dtype": "torch.float32"}
        batch = {"T": "tensor", "shape": [16, 4], "dtype": "torch.float32"}
        return window_batch(step, [
            call("torch.nn.Module.forward", mtype="Linear", args={"0": state}, ret=dict(state, shape=[2])),
            call("torch.nn.Module.forward", mtype="Linear", args={"0": batch}, ret=dict(batch, shape=[out_rows, 2])),
        ])

    rules = [i for i in learn(["APIOutput"], [policy(s, 16) for s in range(4)])
             if i.params.get("prop") == "batch" and i.params.get("mtype") == "Linear"]
    assert len(rules) == 1  # the 1-D forward, whose "batch" 4 became 2, is no counter-example
    assert [v.step for v in check(rules, [policy(s, 1 if s == 2 else 16) for s in range(4)])] == [2]


def test_distinct_rules_are_learned_only_for_rng_values():
    def step(index, tensors, seeds):
        return window_batch(index, [call("torch.distributed.all_reduce", args={"tensor": t}) for t in tensors]
                            + [call("torch.utils.data.worker_init", args={"worker_id": i, "torch_seed": s})
                               for i, s in enumerate(seeds)])

    invariants = learn(["APIArg"], [step(i, [f"g{i}a", f"g{i}b"], [10 * i, 10 * i + 1]) for i in range(4)])
    distinct = {(i.params["api"], i.params["arg"]) for i in invariants if i.params["form"] == "distinct"}
    assert distinct == {("torch.utils.data.worker_init", "torch_seed")}


def test_hyperparameter_values_are_not_learned_as_laws():
    def forward(step):
        return {"kind": "call", "pid": 1, "tid": 1, "stage": "train", "name": "Dropout.forward",
                "api": "torch.nn.Module.forward", "mtype": "Dropout", "training": True, "ctx": {}}

    batches = []
    for step in range(4):
        outer = dict(forward(step), cid=step * 10 + 1, parent=None)
        inner = {"kind": "call", "pid": 1, "tid": 1, "stage": "train", "name": "torch.nn.functional.dropout",
                 "api": "torch.nn.functional.dropout", "cid": step * 10 + 2, "parent": step * 10 + 1, "ctx": {}}
        events = [dict(outer, t=1, phase="pre", args={}),
                  dict(inner, t=2, phase="pre", args={"p": 0.5, "training": True}),
                  dict(inner, t=3, phase="post", ret=None), dict(outer, t=4, phase="post", ret=None),
                  {"kind": "step", "t": 5, "pid": 1, "tid": 1, "stage": "train", "phase": "end"}]
        batches.append(make_batch(run="d", rank=0, world=1, step=step, seq=step, events=events))
    args = [i.params.get("args") for i in learn(["EventContain"], batches) if i.params.get("form") == "call"]
    assert {"training": True} in args and {"p": 0.5} not in args


# ------------------------------------------------------------------ the setup window
def test_worker_seeds_are_judged_in_the_setup_window():
    def run(name, seeds):
        yield window_batch(0, [call("torch.utils.data.worker_init", args={"worker_id": i, "torch_seed": s},
                                    stage="init") for i, s in enumerate(seeds)], run=name, stage="init")
        for step in range(1, 4):
            yield window_batch(step, [call(BACKWARD), call(STEP, obj="opt0")], run=name)

    rules = [i for i in learn(["APIArg"], run("a", [1, 2]), run("b", [3, 4])) if i.params["form"] == "distinct"]
    assert len(rules) == 1
    assert [v.step for v in check(rules, run("bad", [5, 5]))] == [0]


def test_an_optimizers_first_iteration_needs_no_clear_before_it():
    """A second model trained later by its own optimizer, clearing at the end of each
    iteration: its first window has nothing to clear, its later ones must."""
    rules = [i for i in learn(["APISequence"], _single_optimizer_loop(6, call(OPT_ZERO, obj="opt0"), run="ref"))
             if i.params["first"] == OPT_ZERO]
    assert rules

    def second_phase(clears_from: int):
        for step in range(1, 8):
            if step < 4:
                calls = [call(OPT_ZERO, obj="opt0"), call(BACKWARD), call(STEP, obj="opt0", trained=step > 1)]
            else:  # a new optimizer clearing after its step, i.e. at the start of the next window
                calls = [call(BACKWARD), call(STEP, obj="opt1", trained=step > 4)]
                if step >= clears_from:
                    calls.insert(0, call(OPT_ZERO, obj="opt1"))
            yield window_batch(step, calls, run="phase")

    assert check(rules, second_phase(clears_from=5)) == []
    assert {v.step for v in check(rules, second_phase(clears_from=6))} == {5}


def test_an_ordering_rule_counts_every_earlier_call_when_checking():
    """Inference learns only from APIs called a few times per window; checking "forward
    before clip" must still see the forward when an evaluation pass in the same window
    runs many more forwards."""
    FORWARD, CLIP = "torch.nn.Module.forward", "torch.nn.utils.clip_grad_norm_"

    def loop(steps: int, *, evaluation_at: int = -1, forward: bool = True, run: str):
        for step in range(steps):
            calls = ([call(FORWARD, mtype="Linear")] if forward or step < 3 else []) + [call(BACKWARD), call(CLIP)]
            if step == evaluation_at:
                calls += [call(FORWARD, mtype="Linear", stage="eval") for _ in range(8)]
            yield window_batch(step, calls, run=run)

    rules = [i for i in learn(["APISequence"], loop(6, run="ref")) if i.params == {"first": FORWARD, "then": CLIP}]
    assert rules
    assert check(rules, loop(6, evaluation_at=3, run="eval")) == []
    assert {v.step for v in check(rules, loop(6, forward=False, run="broken"))} == {3, 4, 5}


def test_mode_switches_and_a_clear_before_the_forward_are_habits_not_rules():
    def loop(steps: int):
        for step in range(steps):
            yield window_batch(step, [call("torch.nn.Module.train", mtype="Net"), call(OPT_ZERO, obj="opt0"),
                                      call("torch.nn.Module.forward", mtype="Linear"), call(BACKWARD),
                                      call(STEP, obj="opt0")], run="habits")

    pairs = {(i.params["first"], i.params["then"]) for i in learn(["APISequence"], loop(6))}
    assert (OPT_ZERO, BACKWARD) in pairs and (BACKWARD, STEP) in pairs
    assert not {p for p in pairs if p[0] == "torch.nn.Module.train"}
    assert (OPT_ZERO, "torch.nn.Module.forward") not in pairs


def test_an_optimizer_wrapper_sharing_param_groups_is_the_same_optimizer(tmp_path):
    """Lightning's and Accelerate's optimizer wrappers share the inner optimizer's
    ``param_groups``: a ``zero_grad`` through the wrapper clears the optimizer that steps."""
    import producers
    from producers.report import read_trace_dir

    class Wrapper(torch.optim.Optimizer):
        def __init__(self, inner):  # no super().__init__: wrappers delegate, as the real ones do
            self.inner = inner
            self.defaults = inner.defaults

        @property
        def param_groups(self):
            return self.inner.param_groups

        @property
        def state(self):
            return self.inner.state

        def zero_grad(self, set_to_none=True):
            self.inner.zero_grad(set_to_none)

        def step(self, closure=None):
            return self.inner.step(closure)

    with producers.instrument(run_id="wrapped", trace_dir=tmp_path):
        model = torch.nn.Linear(3, 1)
        inner = torch.optim.SGD(model.parameters(), lr=0.1)
        wrapped = Wrapper(inner)
        for _ in range(3):
            wrapped.zero_grad()
            model(torch.randn(4, 3)).sum().backward()
            inner.step()
    (batches,) = read_trace_dir(tmp_path).values()
    objs = {(e["api"].rsplit(".", 1)[1], e.get("obj")) for b in batches for e in b["events"]
            if e["kind"] == "call" and e["phase"] == "pre" and e["api"].startswith("torch.optim.Optimizer")}
    assert objs == {("zero_grad", "opt0"), ("step", "opt0")}
