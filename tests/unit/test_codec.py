import io

import msgpack
import pytest

from invariants.codec import (
    TRACE_MAGIC,
    FrameScan,
    TraceCorruption,
    decode_batch,
    encode_batch,
    encode_frame,
    iter_frames,
)
from invariants.events import SchemaError, batch_key, make_batch


def _batch(step=3, **over):
    batch = make_batch(
        run="r1",
        rank=0,
        world=2,
        step=step,
        seq=1,
        events=[{"kind": "step", "t": 1, "pid": 1, "tid": 1, "stage": "train", "phase": "end"}],
    )
    batch.update(over)
    return batch


def test_round_trip():
    batch = _batch()
    assert decode_batch(encode_batch(batch)) == batch
    assert batch_key("r1", 3) == b"r1:3"


def test_encoding_writes_what_msgpack_writes_including_float_subclasses():
    """Summaries may carry numpy scalars that subclass float, and str subclasses
    (``torch.__version__``): they pack as the plain type."""
    import numpy as np
    import torch

    event = {"kind": "call", "t": 2**62, "pid": 1, "tid": 1, "stage": "train", "phase": "pre",
             "args": {"0": {"T": "tensor", "shape": [3, 4], "value": np.float64(0.25)}, "1": (1, -2, 2**64 - 1)},
             "blob": b"\x00\x01", "text": "é", "none": None, "flag": True, "neg": -(2**63),
             "version": torch.__version__}
    batch = _batch(events=[event])
    assert encode_batch(batch) == msgpack.packb(batch, use_bin_type=True)


def test_what_msgpack_refuses_is_refused_so_the_recorder_sanitises_it():
    import numpy as np

    for refused in (object(), np.int64(3), 2**64):
        with pytest.raises((TypeError, OverflowError)):
            encode_batch(_batch(events=[{"kind": "step", "x": refused}]))


@pytest.mark.parametrize(
    "payload,reason",
    [
        (b"\xc1\xc1garbage", "undecodable"),
        (encode_batch(_batch()) + b"\x00", "undecodable"),  # trailing bytes
        (encode_batch(_batch())[:-3], "undecodable"),  # truncated
        (b"\x81\x91\x01\x02", "missing_field"),  # a map keyed by an array
        (b"\xdd\xff\xff\xff\xff", "undecodable"),  # an array claiming 4G elements
        (msgpack.packb([1, 2, 3]), "wrong_type"),
        (msgpack.packb({"v": 99}), "unknown_version"),
        (encode_batch(_batch(rank=5)), "bad_value"),
        (encode_batch(_batch(rank=True)), "wrong_type"),
        (encode_batch(_batch(events=[{"kind": "nope", "t": 1, "pid": 1, "tid": 1, "stage": "x"}])), "unknown_kind"),
        (encode_batch(_batch(events=[{"kind": "call", "t": 1, "pid": 1, "tid": 1, "stage": "x"}])), "missing_field"),
    ],
)
def test_bad_input_is_a_schema_error_with_reason(payload, reason):
    with pytest.raises(SchemaError) as err:
        decode_batch(payload)
    assert err.value.reason == reason


def test_extension_values_decode_to_values_window_state_can_hold():
    """The contract has no extension types, but a value that carries one must not make
    the window that folds it impossible to persist (the stream worker writes windows
    to a changelog)."""
    from invariants.window import FactPlan, WindowState

    batch = _batch()
    batch["events"].insert(0, {"kind": "state", "t": 1, "pid": 1, "tid": 1, "stage": "train", "name": "w",
                               "at": "step_end", "attrs": {"when": msgpack.Timestamp(7, 0),
                                                           "blob": msgpack.ExtType(5, b"xy")}})
    decoded = decode_batch(msgpack.packb(batch, use_bin_type=True))  # another producer's bytes
    attrs = decoded["events"][0]["attrs"]
    assert attrs["blob"] == msgpack.ExtType(5, b"xy")
    assert attrs["when"].timestamp() == 7
    window = WindowState("r1", 3)
    window.add_batch(decoded, FactPlan.everything())
    restored = WindowState.from_bytes(window.to_bytes())
    assert restored.ranks == window.ranks


def test_oversized():
    with pytest.raises(SchemaError) as err:
        decode_batch(b"x" * 100, max_bytes=10)
    assert err.value.reason == "oversized"


def _trace(*payloads: bytes) -> bytes:
    return TRACE_MAGIC + b"".join(encode_frame(p) for p in payloads)


def test_torn_last_frame_is_truncation_not_corruption():
    data = _trace(b"a" * 10, b"b" * 10)
    for cut in range(len(TRACE_MAGIC) + 18 + 1, len(data)):
        scan = FrameScan()
        frames = list(iter_frames(io.BytesIO(data[:cut]), scan))
        assert frames == [b"a" * 10]
        assert scan.truncated_at == len(TRACE_MAGIC) + 18


def test_corruption_in_the_middle_names_offset():
    data = bytearray(_trace(b"a" * 10, b"b" * 10))
    data[len(TRACE_MAGIC) + 8] ^= 0xFF  # flip a payload byte of the first frame
    with pytest.raises(TraceCorruption) as err:
        list(iter_frames(io.BytesIO(bytes(data))))
    assert err.value.offset == len(TRACE_MAGIC)


def test_bad_magic():
    with pytest.raises(TraceCorruption):
        list(iter_frames(io.BytesIO(b"NOTATRACEFILE")))


from hypothesis import given, strategies as st

from invariants.events import _event_is_valid, validate_event

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=3), st.floats(allow_nan=False))
_fields = st.sampled_from(["kind", "t", "pid", "tid", "stage", "name", "phase", "cid", "attrs", "what"])
_kinds = st.sampled_from(["call", "state", "step", "meta", "other"])


@given(
    st.dictionaries(_fields, st.one_of(_scalars, _kinds, st.sampled_from(["pre", "post", "exc", "begin", "end"]),
                                       st.just({}))),
)
def test_fast_validity_check_never_accepts_what_the_full_check_rejects(event):
    if _event_is_valid(event):
        validate_event(event)  # must not raise
