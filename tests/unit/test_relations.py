"""Each relation template, learned from healthy synthetic runs, catches its bug at the right step."""

from __future__ import annotations

import functools

import pytest

from invariants.engine import Engine
from invariants.step_windows import StepWindows
from invariants.events import make_batch
from invariants.inference import Inferencer, infer
from invariants.invariant_set import InvariantSet
from invariants.model import Invariant
from invariants.synthetic import Fault, SyntheticRun


@functools.lru_cache(maxsize=None)
def learned() -> tuple[Invariant, ...]:
    refs = [
        SyntheticRun(run="ref-a", world=2, steps=8).batches(),
        SyntheticRun(run="ref-b", world=3, steps=8, seed=1).batches(),
    ]
    return tuple(infer(refs))


def check(invariants, batches) -> list:
    windows = StepWindows(Engine(InvariantSet(invariants)))
    found = []
    for batch in batches:
        found.extend(windows.feed(batch))
    found.extend(windows.finish())
    return found


def first_steps(violations, relation: str) -> set[int]:
    return {v.step for v in violations if v.relation == relation}


def find(relation: str, **params) -> Invariant:
    matches = [inv for inv in learned() if inv.relation == relation and all(inv.params.get(k) == v for k, v in params.items())]
    assert matches, f"no {relation} {params} learned"
    return matches[0]


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


def test_cross_rank_consistency_names_the_variable_and_the_odd_rank():
    inv = find("Consistent", scope="ranks", at="post:torch.optim.Optimizer.step", attr="data_digest")
    # learned only from training steps: the rule keeps that context
    assert inv.precondition["any"] == [{"all": [{"kind": "constant", "field": "stage", "values": ["train"]}]}]
    violations = check([inv], SyntheticRun(run="bad", world=3, steps=4, faults=[Fault("drift", 2, 1)]).batches())
    assert [(v.step, v.ranks) for v in violations][0] == (2, [1])
    first = violations[0].evidence["first"]
    assert first["attr"] == "data_digest" and set(first["values_by_rank"]) == {"0", "1", "2"}
    assert violations[0].evidence["sites"] >= 2  # every parameter drifted, grouped into one violation


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


def test_sequence_rules_are_pruned_to_top_level_calls():
    sequences = [inv for inv in learned() if inv.relation == "APISequence"]
    assert any(inv.params == {"first": "torch.optim.Optimizer.zero_grad", "then": "torch.optim.Optimizer.step"} for inv in sequences)
    nested = {"torch.nn.functional.linear", "torch.nn.functional.dropout", "torch.distributed.all_reduce"}
    assert not any(inv.params["first"] in nested or inv.params["then"] in nested for inv in sequences)


def test_api_output_dtype_under_autocast_has_a_context_precondition():
    inv = find("APIOutput", form="constant", api="torch.nn.functional.linear", value="torch.bfloat16")
    fields = {c["field"] for conj in inv.precondition["any"] for c in conj["all"]}
    assert fields & {"stage", "ctx.autocast", "ctx.grad", "training", "ctx.training"}


def _call_batch(step: int, calls: list[dict], *, rank: int = 0, world: int = 1) -> dict:
    events = []
    cid = step * 100
    for call in calls:
        cid += 1
        base = {"kind": "call", "t": cid, "pid": 1, "tid": 1, "stage": "train", "name": call["api"], "api": call["api"],
                "cid": cid, "parent": None, "ctx": {}}
        events.append(dict(base, phase="pre", args=call.get("args", {})))
        events.append(dict(base, phase="post", ret=call.get("ret")))
    events.append({"kind": "step", "t": cid + 50, "pid": 1, "tid": 1, "stage": "train", "phase": "end"})
    return make_batch(run="gen", rank=rank, world=world, step=step, seq=step, events=events)


def test_api_output_bounded_by_argument_and_same_shape_as_input():
    tensor = {"T": "tensor", "shape": [2, 5], "dtype": "float32"}

    def run(lengths):
        for step, length in enumerate(lengths):
            yield _call_batch(step, [
                {"api": "generate", "args": {"max_new_tokens": 8}, "ret": {"T": "tensor", "shape": [1, length]}},
                {"api": "torch.relu", "args": {"input": tensor}, "ret": dict(tensor, shape=[2, 5] if length < 99 else [2, 4])},
            ])

    inferencer = Inferencer(["APIOutput"])
    inferencer.add_trace(run([3, 8, 5, 7]))
    invariants = inferencer.finish()
    params = [inv.params for inv in invariants]
    assert {"form": "bounded", "api": "generate", "arg": "max_new_tokens", "out": "last_dim"} in params
    assert {"form": "same_as_input", "api": "torch.relu", "arg": "input", "prop": "shape"} in params
    violations = check(invariants, run([4, 12, 99]))
    assert {(v.step, v.invariant) for v in violations} == {
        (1, next(i.id for i in invariants if i.params.get("form") == "bounded")),
        (2, next(i.id for i in invariants if i.params.get("form") == "bounded")),
        (2, next(i.id for i in invariants if i.params.get("form") == "same_as_input" and i.params["prop"] == "shape")),
    }


def test_distinct_rule_is_dropped_when_a_reference_repeats_a_value():
    def run(values):
        for step, pair in enumerate(values):
            yield _call_batch(step, [{"api": "torch.nn.init.normal_", "args": {"seed": v}} for v in pair])

    inferencer = Inferencer(["APIArg"])
    inferencer.add_trace(run([(1, 2), (3, 4), (5, 6)]))
    assert [inv.params for inv in inferencer.finish()] == [{"form": "distinct", "api": "torch.nn.init.normal_", "arg": "seed"}]
    inferencer.add_trace(run([(1, 1)]))
    assert inferencer.finish() == []


def test_distinct_rule_ignores_workers_that_report_no_value():
    def run(values):
        for step, pair in enumerate(values):
            yield _call_batch(step, [{"api": "torch.utils.data.worker_init", "args": {"worker_id": i, "dataset_rng_digest": v}}
                                     for i, v in enumerate(pair)])

    # a pipeline whose dataset owns no RNG reports None from every worker: not a repeat
    inferencer = Inferencer(["APIArg"])
    inferencer.add_trace(run([(None, None), (None, None)]))
    inferencer.add_trace(run([("a1", "b1"), ("a2", "b2"), (None, None)]))
    rule = [i for i in inferencer.finish() if i.params["arg"] == "dataset_rng_digest"]
    assert [i.params["form"] for i in rule] == ["distinct"]
    assert check(rule, run([(None, None), ("c", "d"), (None, "e")])) == []
    violations = check(rule, run([("c", "d"), ("f", "f")]))
    assert [(v.step, v.evidence["first"]["repeated_values"]) for v in violations] == [(1, ["f"])]


def test_rank_agreement_of_a_tensor_argument_ignores_each_ranks_own_value():
    """A broadcast's receive buffer holds each rank's own value before the call: the
    ranks must agree on what the call is about (shape, dtype), not on that value."""
    def run(values, shape=(1,)):
        for step, pair in enumerate(values):
            for rank, value in enumerate(pair):
                tensor = {"T": "tensor", "shape": list(shape), "dtype": "int64", "device": "cpu", "value": value}
                yield _call_batch(step, [{"api": "torch.distributed.broadcast", "args": {"tensor": tensor, "src": 0}}],
                                  rank=rank, world=2)

    inferencer = Inferencer(["APIArg"])
    inferencer.add_trace(run([(7, 7), (8, 8), (9, 9)]))
    rule = [i for i in inferencer.finish() if i.params == {"form": "ranks", "api": "torch.distributed.broadcast",
                                                           "arg": "tensor"}]
    assert rule, "learned from ranks that happened to agree"
    assert check(rule, run([(31, 0), (5, 2)])) == []
    assert [v.step for v in check(rule, run([(1, 1), (1, 1)], shape=(2,)))] == []
    mismatched = list(run([(1, 1)])) + [b for b in run([(1, 1)], shape=(3,))]
    mismatched = [b for b in mismatched if b["rank"] == 0][:1] + [b for b in mismatched if b["rank"] == 1][-1:]
    assert [v.step for v in check(rule, mismatched)] == [0]


def test_every_template_has_description_and_hint():
    for inv in learned():
        template_hint = Engine(InvariantSet([inv]))  # compiles
        assert inv.description and template_hint


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


def _rank_local(batches, names, *, from_step=0):
    """Give ``names`` a different value on every rank from ``from_step`` on (expert shards)."""
    for batch in batches:
        if batch["step"] < from_step:
            continue
        for event in batch["events"]:
            if event["kind"] == "state" and (names is None or event["name"] in names):
                event["attrs"]["data_digest"] = f"{event['attrs']['data_digest']}-r{batch['rank']}"
    return batches


def test_rank_local_variables_are_not_judged_as_replicas():
    inv = find("Consistent", scope="ranks", at="post:torch.optim.Optimizer.step", attr="data_digest")
    # expert-parallel style: one variable differs across ranks from step 0, the rest agree
    expert = _rank_local(list(SyntheticRun(run="moe", world=2, steps=5).batches()), {"module.fc2.bias"})
    assert check([inv], expert) == []
    # ...but a replicated variable drifting later is still reported
    drifted = _rank_local(list(SyntheticRun(run="moe", world=2, steps=5, faults=[Fault("drift", 3, 1)]).batches()),
                          {"module.fc2.bias"})
    violations = check([inv], drifted)
    assert violations and min(v.step for v in violations) == 3
    assert all(v.evidence["first"]["variable"] != "module.fc2.bias" for v in violations)


def test_shards_first_seen_at_the_first_iteration_differing_before_the_update_stay_unjudged():
    """The setup window may snapshot nothing: experts initialised from their rank's seed
    are first seen at step 1, already different before their first update."""
    inv = find("Consistent", scope="ranks", at="post:torch.optim.Optimizer.step", attr="data_digest")
    expert = _rank_local(list(SyntheticRun(run="moe", world=2, steps=5).batches()), {"module.fc2.bias"}, from_step=1)
    assert check([inv], expert) == []
    late = _rank_local(list(SyntheticRun(run="moe", world=2, steps=5).batches()), {"module.fc2.bias"}, from_step=2)
    assert [v.step for v in check([inv], late)] == [2, 3, 4]  # parting later is drift


def test_a_replica_that_parts_at_its_first_update_is_reported_at_step_one():
    """Differing only after the first update is a skipped all-reduce (a submodule called
    outside its DDP wrapper from the start), not a shard."""
    inv = find("Consistent", scope="ranks", at="post:torch.optim.Optimizer.step", attr="data_digest")
    batches = list(SyntheticRun(run="outside", world=2, steps=4).batches())
    for batch in batches:
        for event in batch["events"]:
            if event["kind"] == "state" and event["name"] == "module.fc2.bias" and batch["step"] >= 1 \
                    and event["at"] != "pre:torch.optim.Optimizer.step" and not (
                        batch["step"] == 1 and event["at"].startswith("pre:")):
                event["attrs"]["data_digest"] = f"{event['attrs']['data_digest']}-r{batch['rank']}"
    assert [v.step for v in check([inv], batches)] == [1, 2, 3]


def test_replicas_never_synchronised_are_reported_from_step_zero():
    inv = find("Consistent", scope="ranks", at="post:torch.optim.Optimizer.step", attr="data_digest")
    unsynced = _rank_local(list(SyntheticRun(run="nosync", world=2, steps=3).batches()), None)
    assert [v.step for v in check([inv], unsynced)] == [0, 1, 2]


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


def _sampler_batch(step: int, generated: int, *, mtype: str = "GreedySampler", dtype: str = "int64",
                   budget: str = "max_new_tokens") -> dict:
    """A module forward whose budget arrives as a keyword argument on the post event only."""
    base = {"kind": "call", "pid": 1, "tid": 1, "stage": "eval", "name": f"{mtype}.forward",
            "api": "torch.nn.Module.forward", "cid": step * 10 + 1, "parent": None, "module": "",
            "mtype": mtype, "training": False, "ctx": {"grad": False}}
    events = [dict(base, t=step * 10, phase="pre", args={"0": {"T": "tensor", "shape": [2, 4], "dtype": "int64"}}),
              dict(base, t=step * 10 + 1, phase="post", kwargs={budget: 6},
                   ret={"T": "tensor", "shape": [2, generated], "dtype": dtype}),
              {"kind": "step", "t": step * 10 + 5, "pid": 1, "tid": 1, "stage": "eval", "phase": "end"}]
    return make_batch(run="gen", rank=0, world=1, step=step, seq=step, events=events)


def test_generation_budget_from_post_event_kwargs_transfers_across_module_types():
    inferencer = Inferencer(["APIOutput"])
    inferencer.add_trace([_sampler_batch(s, 6 - s % 2) for s in range(4)])
    invariants = inferencer.finish()
    typeless = [i for i in invariants if i.params == {"form": "bounded", "api": "torch.nn.Module.forward",
                                                      "arg": "max_new_tokens", "out": "last_dim"}]
    assert typeless and typeless[0].precondition is None
    # another pipeline's sampler class, in another stage, overrunning its budget at step 2
    other = [_sampler_batch(s, 9 if s == 2 else 5, mtype="BeamSearcher") for s in range(4)]
    assert [(v.step, v.evidence["first"]["last_dim"]) for v in check(typeless, other)] == [(2, 9)]
    # float outputs (logits) of a module given some max_* keyword are not generated tokens
    logits = [_sampler_batch(s, 99, mtype="BeamSearcher", dtype="float32") for s in range(4)]
    assert check(typeless, logits) == []


def test_budget_words_of_no_generation_give_no_rule_about_a_user_class():
    # not a generation budget, so not the type-free rule; and a user's class name keys no rule
    inferencer = Inferencer(["APIOutput"])
    inferencer.add_trace([_sampler_batch(s, 3, budget="max_norm") for s in range(4)])
    assert [i.params for i in inferencer.finish() if i.params.get("form") == "bounded"] == []


#: module types of these tests that hold parameters (the producer marks the others ``no_params``)
WITH_PARAMS = {"Conv2d", "GraphReadout", "CharLM"}


def _forward_batch(step: int, modules: list[tuple[str, list[int], list[int]]], *, stage: str = "train") -> dict:
    """Module forwards of one step: (module type, input shape, output shape)."""
    events = []
    for index, (mtype, shape_in, shape_out) in enumerate(modules):
        cid = step * 100 + index + 1
        ctx = {"grad": stage == "train"} if mtype in WITH_PARAMS else {"grad": stage == "train", "no_params": True}
        base = {"kind": "call", "pid": 1, "tid": 1, "stage": stage, "name": f"{mtype}.forward",
                "api": "torch.nn.Module.forward", "cid": cid, "parent": None, "module": f"m{index}",
                "mtype": mtype, "training": stage == "train", "ctx": ctx}
        events.append(dict(base, t=cid * 2, phase="pre", args={"0": {"T": "tensor", "shape": shape_in, "dtype": "float32"}}))
        events.append(dict(base, t=cid * 2 + 1, phase="post", ret={"T": "tensor", "shape": shape_out, "dtype": "float32"}))
    events.append({"kind": "step", "t": step * 1000 + 999, "pid": 1, "tid": 1, "stage": stage, "phase": "end"})
    return make_batch(run="fw", rank=0, world=1, step=step, seq=step, events=events)


BATCH_KEEPING = {"form": "same_as_input", "api": "torch.nn.Module.forward", "arg": "0", "prop": "batch"}


def test_modules_that_keep_their_input_rank_keep_the_batch_whatever_their_type():
    healthy = [
        ("Conv2d", [16, 1, 8, 8], [16, 8, 8, 8]),
        ("Encoder", [16, 8, 8, 8], [16, 8, 4, 4]),
        ("GraphReadout", [37, 8], [6, 8]),  # a model pooling nodes into graphs: not judged
        ("CharLM", [8, 12], [96, 30]),  # a model merging time into the batch: not judged
        ("Flatten", [16, 8, 4, 4], [16, 128]),  # a change of rank: not judged
        ("LMHead", [4, 7, 32], [28, 32]),  # (B, T, V) -> (B*T, V) logits: not judged
        ("PositionalTable", [7], [5]),  # rank 1: not a batch axis
    ]
    inferencer = Inferencer(["APIOutput"])
    inferencer.add_trace([_forward_batch(s, healthy, stage="train" if s < 3 else "eval") for s in range(4)])
    rules = [i for i in inferencer.finish() if i.params == BATCH_KEEPING]
    assert len(rules) == 1 and rules[0].precondition is None
    assert "keeps its batch size" in rules[0].description
    # another pipeline: its own preprocessing class collapses the batch to one sample at step 2
    other = [_forward_batch(s, [("Preprocessor", [16, 1, 8, 8], [1 if s == 2 else 16, 1, 10, 10]),
                                ("LMHead", [2, 9, 50], [18, 50]), ("PositionalTable", [9], [3]),
                                ("GraphReadout", [41, 8], [5, 8])])
             for s in range(4)]
    violations = check(rules, other)
    assert [(v.step, v.evidence["first"]["mtype"], v.evidence["first"]["input"], v.evidence["first"]["output"])
            for v in violations] == [(2, "Preprocessor", 16, 1)]


def test_batch_keeping_rule_is_not_learned_when_a_reference_module_regroups_samples():
    regrouping = [("PatchesAsBatch", [4, 3, 8, 8], [64, 3, 2, 2]), ("Conv2d", [4, 3, 8, 8], [4, 8, 8, 8])]
    inferencer = Inferencer(["APIOutput"])
    inferencer.add_trace([_forward_batch(s, regrouping) for s in range(4)])
    assert not [i for i in inferencer.finish() if i.params == BATCH_KEEPING]


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


def test_variables_marked_as_shards_by_their_framework_are_not_replicas():
    inv = find("Consistent", scope="ranks", at="post:torch.optim.Optimizer.step", attr="data_digest")

    def shard(batches, from_step, marks):
        """module.fc2.bias: identical at first (zero-initialised), rank-local from ``from_step``."""
        for batch in batches:
            for event in batch["events"]:
                if event["kind"] == "state" and event["name"] == "module.fc2.bias":
                    if marks is not None:
                        event["attrs"]["parallel"] = marks
                    if batch["step"] >= from_step:
                        event["attrs"]["data_digest"] += f"-r{batch['rank']}"
        return batches

    marked = shard(list(SyntheticRun(run="tp", world=2, steps=5).batches()), 2, {"tensor_model_parallel": True})
    assert check([inv], marked) == []
    expert = shard(list(SyntheticRun(run="moe", world=2, steps=5).batches()), 2, {"allreduce": False})
    assert check([inv], expert) == []
    # unmarked, the same divergence is a replica drifting apart
    unmarked = shard(list(SyntheticRun(run="dp", world=2, steps=5).batches()), 2, None)
    assert [v.step for v in check([inv], unmarked)] == [2, 3, 4]
    # a mark that says "replicated" (sequence-parallel LayerNorm) does not exempt it
    replicated = shard(list(SyntheticRun(run="sp", world=2, steps=5).batches()), 2, {"sequence_parallel": True})
    assert [v.step for v in check([inv], replicated)] == [2, 3, 4]


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
