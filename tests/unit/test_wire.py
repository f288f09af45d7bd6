"""The typed decoder accepts exactly what `decode_batch` accepts, with the same reasons,
and folding its batches gives the same windows and summaries as folding dict batches."""

import msgpack
import pytest
from hypothesis import given, settings, strategies as st

from invariants.codec import decode_batch, encode_batch
from invariants.events import SchemaError, make_batch
from invariants.invariant_file import load_default_set
from invariants.step_summary import SUMMARY_STATE_ATTRS, StepSummaryBuilder
from invariants.synthetic import SyntheticRun
from invariants.window import FactPlan, WindowState
from invariants.wire import UNSET, payload, wire_types

ENVELOPE = {"t": 1, "pid": 7, "tid": 1, "stage": "train"}


def _batch(events, **over):
    batch = make_batch(run="r1", rank=0, world=2, step=3, seq=1, events=events)
    batch.update(over)
    return batch


@pytest.mark.parametrize(
    "payload,reason",
    [
        (b"\xc1\xc1garbage", "undecodable"),
        (encode_batch(_batch([])) + b"\x00", "undecodable"),
        (encode_batch(_batch([]))[:-3], "undecodable"),
        (b"\x81\x91\x01\x02", "missing_field"),
        (b"\xdd\xff\xff\xff\xff", "undecodable"),
        (msgpack.packb([1, 2, 3]), "wrong_type"),
        (msgpack.packb({"v": 99}), "unknown_version"),
        (encode_batch(_batch([], v=2)), "unknown_version"),
        (encode_batch(_batch([], rank=5)), "bad_value"),
        (encode_batch(_batch([], step=-1)), "bad_value"),
        (encode_batch(_batch([], rank=True)), "wrong_type"),
        (encode_batch(_batch([{"kind": "nope", **ENVELOPE}])), "unknown_kind"),
        (encode_batch(_batch([{"kind": "call", **ENVELOPE}])), "missing_field"),
        (encode_batch(_batch([{"kind": "call", **ENVELOPE, "name": "f", "phase": "mid", "cid": 1}])), "bad_value"),
        (encode_batch(_batch([{"kind": "state", **ENVELOPE, "name": "w", "attrs": []}])), "wrong_type"),
        (encode_batch(_batch([{"kind": "step", **ENVELOPE, "t": 1.5, "phase": "end"}])), "wrong_type"),
        (encode_batch(_batch([7])), "wrong_type"),
    ],
)
@pytest.mark.parametrize("selection", [None, ("shape", "dtype")])
def test_rejections_carry_the_contract_reason(payload, reason, selection):
    with pytest.raises(SchemaError) as err:
        wire_types(selection).decode(payload)
    assert err.value.reason == reason


def test_oversized_is_rejected_before_decoding():
    with pytest.raises(SchemaError) as err:
        wire_types().decode(encode_batch(_batch([])), max_bytes=10)
    assert err.value.reason == "oversized"


def test_absent_and_none_stay_distinct_where_they_differ():
    events = [
        {"kind": "call", **ENVELOPE, "name": "f", "phase": "post", "cid": 1},
        {"kind": "call", **ENVELOPE, "name": "f", "phase": "post", "cid": 2, "ret": None},
        {"kind": "state", **ENVELOPE, "name": "w", "attrs": {"shape": [2], "device": "cpu"}},
    ]
    batch = wire_types(("shape",)).decode(encode_batch(_batch(events)))
    assert batch.events[0].ret is UNSET and payload(batch.events[1].ret) is None
    assert batch.events[2].vtype is UNSET
    assert batch.events[2].attrs == {"shape": [2]}  # unselected attributes are skipped


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=False),
                     st.sampled_from(["call", "state", "step", "meta", "pre", "post", "exc", "begin", "end", "x"]))
_values = st.one_of(_scalars, st.just({}), st.just({"shape": [1]}), st.just([1]))
_event_fields = st.sampled_from(["kind", "t", "pid", "tid", "stage", "name", "phase", "cid", "attrs", "what",
                                 "args", "ret", "workers", "at"])
_events = st.dictionaries(_event_fields, _values, max_size=10)
_batch_fields = st.sampled_from(["v", "run", "rank", "world", "step", "seq", "events"])


@settings(max_examples=400, deadline=None)
@given(
    events=st.lists(st.one_of(_events, st.builds(lambda kind, extra: {"kind": kind, **ENVELOPE, **extra},
                                                 st.sampled_from(["call", "state", "step", "meta"]), _events)),
                    max_size=3),
    overrides=st.dictionaries(_batch_fields, _values, max_size=2),
)
def test_typed_decoder_accepts_exactly_what_the_dict_decoder_accepts(events, overrides):
    batch = _batch(events)
    batch.update(overrides)
    payload = encode_batch(batch)
    try:
        decode_batch(payload)
        expected = None
    except SchemaError as exc:
        expected = exc.reason
    for selection in (None, ("shape",)):
        try:
            wire_types(selection).decode(payload)
            got = None
        except SchemaError as exc:
            got = exc.reason
        assert got == expected, (events, overrides)


def _facts(window: WindowState) -> dict:
    return {"world": window.world, "batches": window.batches, "events": window.events, "ranks": window.ranks}


@pytest.mark.parametrize("plan_of", ["default", "everything"])
def test_folding_typed_batches_equals_folding_dict_batches(plan_of):
    plan = load_default_set().plan if plan_of == "default" else FactPlan.everything()
    kept = plan.kept_attrs()
    wire = wire_types(None if kept is None else (*kept, *SUMMARY_STATE_ATTRS))
    run = SyntheticRun(run="fold", steps=6, extra_layers=3, split_steps=True)
    typed_windows: dict[int, WindowState] = {}
    dict_windows: dict[int, WindowState] = {}
    typed_summaries: dict[int, StepSummaryBuilder] = {}
    dict_summaries: dict[int, StepSummaryBuilder] = {}
    for batch in run.batches():
        step = batch["step"]
        payload = encode_batch(batch)
        typed = wire.decode(payload)
        typed_summaries.setdefault(step, StepSummaryBuilder("fold", step)).add_batch(typed)
        typed_windows.setdefault(step, WindowState("fold", step)).add_batch(typed, plan)
        dict_batch = decode_batch(payload)
        dict_summaries.setdefault(step, StepSummaryBuilder("fold", step)).add_batch(dict_batch)
        dict_windows.setdefault(step, WindowState("fold", step)).add_batch(dict_batch, plan)
    assert typed_windows.keys() == dict_windows.keys() and len(typed_windows) >= 6
    for step, window in typed_windows.items():
        assert _facts(window) == _facts(dict_windows[step])
        # the window state round-trips through its table bytes
        assert _facts(WindowState.from_bytes(window.to_bytes())) == _facts(window)
        assert typed_summaries[step].summary() == dict_summaries[step].summary()
    some_state = next(iter(next(iter(typed_windows.values())).ranks[0].states.values()))
    attrs = next(iter(next(iter(some_state.values())).values()))
    assert "device" not in attrs or kept is None  # only what the plan keeps is decoded


def test_folding_a_dict_batch_twice_leaves_it_unchanged():
    events = [
        {"kind": "call", **ENVELOPE, "name": "torch.nn.Module.forward", "phase": "pre", "cid": 1,
         "args": {"0": 1}},
        {"kind": "call", **ENVELOPE, "name": "torch.nn.Module.forward", "phase": "post", "cid": 1,
         "kwargs": {"mask": True}},
        {"kind": "state", **ENVELOPE, "name": "w", "attrs": {"shape": [2]}, "at": "step_end"},
    ]
    batch = _batch(events)
    before = msgpack.packb(batch)
    first, second = WindowState("r1", 3), WindowState("r1", 3)
    first.add_batch(batch, FactPlan.everything())
    second.add_batch(batch, FactPlan.everything())
    assert msgpack.packb(batch) == before
    assert first.ranks == second.ranks
    assert first.ranks[0].calls[0]["args"] == {"0": 1, "mask": True}


def test_optional_fields_of_any_type_do_not_break_the_fold_or_the_summary():
    events = [
        {"kind": "call", **ENVELOPE, "name": "torch.Tensor.backward", "phase": "pre", "cid": 1, "api": [1, 2],
         "args": {"self": 2.5}, "module": {"x": 1}, "training": "yes", "ctx": [1], "parent": [3]},
        {"kind": "state", **ENVELOPE, "name": "w", "attrs": {"grad_norm": "big"}, "at": {"a": 1}, "cid": [1]},
    ]
    batch = wire_types().decode(encode_batch(_batch(events)))
    window = WindowState("r1", 3)
    window.add_batch(batch, FactPlan.everything())
    summary = StepSummaryBuilder("r1", 3)
    summary.add_batch(batch)
    assert summary.summary().loss == 2.5  # the api falls back to the name
    assert window.ranks[0].calls[0]["api"] == "torch.Tensor.backward"
