"""Invariant files: round trip, deterministic text, precise validation errors, shipped default set."""

from __future__ import annotations

import json

import pytest

from invariants.invariant_file import InvariantFileError, dumps, load_default_set, loads
from invariants.model import Invariant
from invariants.selection import needed_apis
from invariants.invariant_set import InvariantSet

STEP_CHANGES = Invariant(
    "EventContain",
    {"form": "state", "api": "torch.optim.Optimizer.step", "attr": "data_digest", "effect": "changes"},
    {"negated": False, "any": [{"all": [{"kind": "constant", "field": "has_grad", "values": [True]}]}]},
    "the optimizer step changes parameters that have a gradient", ["torch.optim.Optimizer.step"],
)
CROSS_RANK = Invariant("Consistent", {"scope": "ranks", "at": "step_end", "attr": "data_digest"}, None,
                       "weights equal on all ranks", ["torch.optim.Optimizer.step"])


def doc(*items):
    return {"format": "trainwatch-invariants", "version": 1, "invariants": list(items)}


def test_round_trip_is_byte_stable_and_order_independent():
    text = dumps([STEP_CHANGES, CROSS_RANK])
    assert text == dumps([CROSS_RANK, STEP_CHANGES])
    loaded = loads(text, "x.json")
    assert [i.id for i in loaded] == sorted([STEP_CHANGES.id, CROSS_RANK.id])
    assert dumps(loaded) == text


def test_id_is_content_derived():
    same = Invariant(STEP_CHANGES.relation, dict(STEP_CHANGES.params), STEP_CHANGES.precondition, "other words")
    assert same.id == STEP_CHANGES.id
    assert Invariant(STEP_CHANGES.relation, STEP_CHANGES.params, None).id != STEP_CHANGES.id


@pytest.mark.parametrize(
    "data, index, field, words",
    [
        ("{not json", None, None, "not valid JSON"),
        ({"format": "other", "version": 1, "invariants": []}, None, "format", "format"),
        ({"format": "trainwatch-invariants", "version": 99, "invariants": []}, None, "version", "unsupported version 99"),
        ({"format": "trainwatch-invariants", "version": 1, "invariants": {}}, None, "invariants", "must be a list"),
        (doc({"relation": "Nope", "params": {}}), 0, "relation", "unknown relation"),
        (doc(CROSS_RANK.to_dict(), {"relation": "Consistent", "params": {"scope": "ranks", "at": "x"}}), 1, "params.attr", "missing or invalid"),
        (doc({"relation": "APIArg", "params": {"form": "sideways", "api": "a", "arg": "b"}}), 0, "params.form", "invalid"),
        (doc(dict(STEP_CHANGES.to_dict(), precondition={"any": [{"all": [{"kind": "maybe", "field": "x"}]}]})), 0,
         "precondition.any[0].all[0].kind", "must be one of"),
        (doc(dict(STEP_CHANGES.to_dict(), precondition={"any": [{"all": [{"kind": "constant", "field": "x", "values": []}]}]})), 0,
         "precondition.any[0].all[0].values", "non-empty"),
        (doc(dict(CROSS_RANK.to_dict(), examples={"positive": -1})), 0, "examples.positive", "non-negative"),
        (doc(dict(CROSS_RANK.to_dict(), id="inv-0000")), 0, "id", "does not match"),
    ],
)
def test_validation_errors_name_source_index_and_field(data, index, field, words):
    text = data if isinstance(data, str) else json.dumps(data)
    with pytest.raises(InvariantFileError) as info:
        loads(text, "my.json")
    err = info.value
    assert str(err).startswith("my.json")
    assert err.index == index
    assert err.field == field
    assert words in str(err)


def test_shipped_default_set_loads_and_selects_apis():
    default = load_default_set()  # validates every entry, ids included
    assert len(default) >= 10
    assert {"Consistent", "EventContain", "AllRanksReport"} <= default.relations()
    apis = needed_apis(default)
    assert {"torch.optim.Optimizer.step", "torch.optim.Optimizer.zero_grad"} <= apis


def test_needed_apis_include_snapshot_points_and_children():
    contain_call = Invariant("EventContain", {"form": "call", "api": "torch.Tensor.backward", "child": "torch.distributed.all_reduce"})
    apis = needed_apis(InvariantSet([CROSS_RANK, STEP_CHANGES, contain_call]))
    assert apis == {"torch.optim.Optimizer.step", "torch.Tensor.backward", "torch.distributed.all_reduce"}
