"""APIOutput: constant output properties, outputs bounded by an argument (generation
budgets) and modules that keep their input's batch size."""

from __future__ import annotations

from invariants.events import make_batch
from invariants.inference import Inferencer
from tests.support.relation_batches import call_batch, check, find


def test_api_output_dtype_under_autocast_has_a_context_precondition():
    inv = find("APIOutput", form="constant", api="torch.nn.functional.linear", value="torch.bfloat16")
    fields = {c["field"] for conj in inv.precondition["any"] for c in conj["all"]}
    assert fields & {"stage", "ctx.autocast", "ctx.grad", "training", "ctx.training"}


def test_api_output_bounded_by_argument_and_same_shape_as_input():
    tensor = {"T": "tensor", "shape": [2, 5], "dtype": "float32"}

    def run(lengths):
        for step, length in enumerate(lengths):
            yield call_batch(step, [
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
