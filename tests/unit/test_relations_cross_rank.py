"""Rules across ranks and workers: replicas agree (Consistent over ranks) unless they are
shards, and call arguments agree across ranks or differ across workers (APIArg)."""

from __future__ import annotations

from invariants.inference import Inferencer
from invariants.synthetic import Fault, SyntheticRun
from tests.support.relation_batches import call_batch, check, find


def test_cross_rank_consistency_names_the_variable_and_the_odd_rank():
    inv = find("Consistent", scope="ranks", at="post:torch.optim.Optimizer.step", attr="data_digest")
    # learned only from training steps: the rule keeps that context
    assert inv.precondition["any"] == [{"all": [{"kind": "constant", "field": "stage", "values": ["train"]}]}]
    violations = check([inv], SyntheticRun(run="bad", world=3, steps=4, faults=[Fault("drift", 2, 1)]).batches())
    assert [(v.step, v.ranks) for v in violations][0] == (2, [1])
    first = violations[0].evidence["first"]
    assert first["attr"] == "data_digest" and set(first["values_by_rank"]) == {"0", "1", "2"}
    assert violations[0].evidence["sites"] >= 2  # every parameter drifted, grouped into one violation


def test_distinct_rule_is_dropped_when_a_reference_repeats_a_value():
    def run(values):
        for step, pair in enumerate(values):
            yield call_batch(step, [{"api": "torch.nn.init.normal_", "args": {"seed": v}} for v in pair])

    inferencer = Inferencer(["APIArg"])
    inferencer.add_trace(run([(1, 2), (3, 4), (5, 6)]))
    assert [inv.params for inv in inferencer.finish()] == [{"form": "distinct", "api": "torch.nn.init.normal_", "arg": "seed"}]
    inferencer.add_trace(run([(1, 1)]))
    assert inferencer.finish() == []


def test_distinct_rule_ignores_workers_that_report_no_value():
    def run(values):
        for step, pair in enumerate(values):
            yield call_batch(step, [{"api": "torch.utils.data.worker_init", "args": {"worker_id": i, "dataset_rng_digest": v}}
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
                yield call_batch(step, [{"api": "torch.distributed.broadcast", "args": {"tensor": tensor, "src": 0}}],
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


def test_ranks_training_on_the_same_batches_are_reported_apart_from_steps_without_a_batch():
    """Replicas draw batches of their own: a step whose ranks trained on the same batch
    digest breaks ``apart``; a step that drew no batch on a rank (None) is not judged."""
    step_api = "torch.optim.Optimizer.step"

    def run(digests):
        for step, by_rank in enumerate(digests):
            for rank, digest in enumerate(by_rank):
                yield call_batch(step, [{"api": step_api, "args": {"batch_digest": digest}}], rank=rank, world=2)

    inferencer = Inferencer(["APIArg"])
    inferencer.add_trace(run([("a0", "b0"), ("a1", "b1"), ("a2", None)]))
    rules = inferencer.finish()
    # learnt only as differing across ranks: agreement and within-rank forms are refused
    assert [inv.params for inv in rules] == [{"form": "apart", "api": step_api, "arg": "batch_digest"}]
    assert check(rules, run([("c0", "d0"), ("c1", None)])) == []
    violations = check(rules, run([("c0", "d0"), ("c1", "d1"), ("e", "e")]))
    assert [(v.step, v.ranks) for v in violations] == [(2, [0, 1])]
    assert violations[0].evidence["first"]["ranks_with_the_same_value"] == [0, 1]
    # one healthy reference whose ranks shared a batch drops the rule
    inferencer.add_trace(run([("f", "f")]))
    assert inferencer.finish() == []


def test_separate_models_are_compared_across_ranks_only_on_collectives():
    """Pipeline stages and federated clients train models of their own: a backward's or a
    clip's arguments differ across their ranks by design, a collective's must not."""
    def run(shapes, separate):
        for step in range(3):
            for rank, shape in enumerate(shapes):
                tensor = {"T": "tensor", "shape": shape, "dtype": "float32", "device": "cpu"}
                calls = [{"api": "torch.Tensor.backward", "args": {"self": tensor}},
                         {"api": "torch.distributed.all_reduce", "args": {"tensor": tensor}}]
                batch = call_batch(step, calls, rank=rank, world=2)
                for event in batch["events"]:
                    if event["kind"] == "call" and separate:
                        event["ctx"] = {"separate": True}
                yield batch

    inferencer = Inferencer(["APIArg"])
    inferencer.add_trace(run([[1], [1]], separate=False))
    rules = [inv for inv in inferencer.finish() if inv.params["form"] == "ranks"]
    assert {inv.params["api"] for inv in rules} == {"torch.Tensor.backward", "torch.distributed.all_reduce"}
    api_of = {inv.id: inv.params["api"] for inv in rules}
    assert {api_of[v.invariant] for v in check(rules, run([[1], [4, 2]], separate=False))} == {
        "torch.Tensor.backward", "torch.distributed.all_reduce"}
    assert {api_of[v.invariant] for v in check(rules, run([[1], [4, 2]], separate=True))} == {
        "torch.distributed.all_reduce"}
