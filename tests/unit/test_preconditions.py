"""Precondition inference and checking agree on clause semantics."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from invariants.precondition import compile_precondition, describe_precondition, validate_precondition
from invariants.precondition_inference import infer_precondition, signature


def sigs(*examples):
    return Counter(signature(records) for records in examples)


def test_no_negatives_means_no_precondition_beyond_the_shared_context():
    assert infer_precondition(sigs([{"mtype": "Linear"}], [{"mtype": "Conv2d"}]), Counter()) == (True, None)
    ok, pre = infer_precondition(sigs([{"stage": "train", "ctx.autocast": None, "mtype": "Linear"}]), Counter())
    assert ok and pre["any"] == [{"all": [{"kind": "constant", "field": "stage", "values": ["train"]},
                                          {"kind": "constant", "field": "ctx.autocast", "values": [None]}]}]
    check = compile_precondition(pre)
    assert check([{"stage": "train", "ctx.autocast": None}])
    assert not check([{"stage": "train", "ctx.autocast": "bfloat16"}]) and not check([{"stage": "eval", "ctx.autocast": None}])


def test_single_clause_separates_trainable_from_frozen():
    pos = sigs([{"stage": "train", "has_grad": True, "requires_grad": True, "mtype": "Linear"}],
               [{"stage": "train", "has_grad": True, "requires_grad": True, "mtype": "Conv2d"}])
    neg = sigs([{"stage": "train", "has_grad": False, "requires_grad": False, "mtype": "Linear"}])
    ok, pre = infer_precondition(pos, neg)
    assert ok
    assert pre == {"negated": False, "any": [{"all": [{"kind": "constant", "field": "stage", "values": ["train"]},
                                                      {"kind": "constant", "field": "has_grad", "values": [True]}]}]}
    check = compile_precondition(pre)
    assert check([{"has_grad": True, "stage": "train"}]) and not check([{"has_grad": False, "stage": "train"}])
    assert not check([{"stage": "train"}]) and not check([{"has_grad": True, "stage": "eval"}])
    assert describe_precondition(pre) == "stage = 'train' and has_grad = True"


def test_disjunction_when_no_single_conjunction_fits():
    pos = sigs([{"mtype": "Dropout", "stage": "eval"}], [{"mtype": "BatchNorm2d", "stage": "eval"}])
    neg = sigs([{"mtype": "Linear", "stage": "eval"}], [{"mtype": "Conv2d", "stage": "eval"}])
    ok, pre = infer_precondition(pos, neg)
    assert ok and len(pre["any"]) == 2
    check = compile_precondition(pre)
    assert check([{"mtype": "Dropout", "stage": "eval"}]) and check([{"mtype": "BatchNorm2d", "stage": "eval"}])
    assert not check([{"mtype": "Linear", "stage": "eval"}])


def test_open_world_negation_is_refused():
    # five module types need more disjuncts than allowed; "not Embedding and not TinyLM"
    # would also accept module types never seen, so the rule is dropped instead
    pos = sigs(*[[{"mtype": m}] for m in ("Linear", "Conv2d", "ReLU", "LayerNorm", "Dropout")])
    neg = sigs([{"mtype": "Embedding"}], [{"mtype": "TinyLM"}])
    assert infer_precondition(pos, neg) == (False, None)


def test_negated_formula_for_rules_with_a_narrow_exception():
    # positives are varied, negatives share "first step": learn NOT(step_is_first)
    pos = sigs(*[[{"step_is_first": False, "mtype": m, "stage": s}] for m in ("A", "B", "C", "D", "E", "F") for s in ("train", "eval")],
               [{"step_is_first": True, "mtype": "A", "stage": "eval"}])
    neg = sigs([{"step_is_first": True, "mtype": "A", "stage": "train"}], [{"step_is_first": True, "mtype": "B", "stage": "train"}])
    ok, pre = infer_precondition(pos, neg)
    assert ok
    check = compile_precondition(pre)
    assert check([{"step_is_first": False, "mtype": "Z", "stage": "train"}])
    assert not check([{"step_is_first": True, "mtype": "B", "stage": "train"}])


def test_inseparable_examples_fail():
    same = [{"stage": "train", "mtype": "Linear"}]
    assert infer_precondition(sigs(same), sigs(same)) == (False, None)


def test_multi_record_clauses_consistent_and_unequal():
    records = [{"rank": 0, "name": "w", "stage": "train"}, {"rank": 1, "name": "w", "stage": "train"}]
    sig = signature(records)
    assert ("unequal", "rank") in sig and ("consistent", "name") in sig and ("constant", "stage", "train", "str") in sig
    assert not any(c[0] == "constant" and c[1] == "rank" for c in sig)
    pre = {"negated": False, "any": [{"all": [{"kind": "unequal", "field": "rank"}, {"kind": "consistent", "field": "name"},
                                              {"kind": "exists", "field": "stage"}]}]}
    check = compile_precondition(pre)
    assert check(records)
    assert not check([{"rank": 0, "name": "w", "stage": "x"}, {"rank": 0, "name": "w", "stage": "x"}])
    assert not check([{"rank": 0, "name": "w"}, {"rank": 1, "name": "v", "stage": "x"}])


def test_negated_clause():
    pre = {"negated": False, "any": [{"all": [{"kind": "constant", "field": "stage", "values": ["eval"], "negated": True}]}]}
    check = compile_precondition(pre)
    assert check([{"stage": "train"}]) and not check([{"stage": "eval"}])
    validate_precondition(pre, "p")


scalars = st.one_of(st.booleans(), st.sampled_from(["train", "eval", "Linear"]), st.integers(0, 3))
record = st.dictionaries(st.sampled_from(["stage", "mtype", "has_grad", "rank", "dtype"]), scalars, max_size=4)


@settings(max_examples=150, deadline=None)
@given(records=st.lists(record, min_size=1, max_size=3))
def test_every_signature_clause_holds_when_compiled(records):
    for clause in signature(records):
        if clause[0] == "constant":
            c = {"kind": "constant", "field": clause[1], "values": [clause[2]]}
        else:
            c = {"kind": clause[0], "field": clause[1]}
        assert compile_precondition({"negated": False, "any": [{"all": [c]}]})(records), clause


@settings(max_examples=100, deadline=None)
@given(pos=st.lists(record, min_size=1, max_size=6), neg=st.lists(record, max_size=6))
def test_learned_precondition_accepts_all_positives_and_rejects_all_negatives(pos, neg):
    ok, pre = infer_precondition(sigs(*[[r] for r in pos]), sigs(*[[r] for r in neg]))
    if not ok:
        return
    check = compile_precondition(pre)
    assert all(check([r]) for r in pos)
    assert not any(check([r]) for r in neg)
