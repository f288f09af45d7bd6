"""Fault injection: hostile or damaged input at every edge where it enters.

Each test feeds one kind of bad input (an absurd world size, deep nesting, more
trace files than descriptors, badly typed invariant files, a bit flip in a trace's
last frame, an ``-i`` file that names nothing recordable) through the real decoders
and the real commands, and checks the guarantee the README states for it: a
dead-letter record with a stable reason, or one line on stderr and exit 2; never a
traceback, a stall, a giant report, or a silent pass.
"""

from __future__ import annotations

import collections
import io
import json
import resource
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

from invariants.codec import (TRACE_MAGIC, FrameScan, TraceCorruption, decode_batch, encode_batch, encode_frame,
                              iter_frames)
from invariants.engine import Engine, RunState
from invariants.events import SchemaError, make_batch
from invariants.invariant_file import InvariantFileError, dumps, load_default_set, loads
from invariants.invariant_set import InvariantSet
from invariants.synthetic import SyntheticRun
from invariants.wire import wire_types
from trainwatch.cli import main
from trainwatch.tracedir import read_trace_dir, write_trace_dir

ROOT = Path(__file__).resolve().parents[1]
WORLD_LIMIT = 65_536  # the documented maximum world size (README "Faults and bounds")


def _event(kind: str, **fields) -> dict:
    return {"kind": kind, "t": 1, "pid": 1000, "tid": 1, "stage": "train", **fields}


def _step_batch(rank: int, world: int, step: int, *events: dict) -> dict:
    return make_batch(run="r", rank=rank, world=world, step=step, seq=step,
                      events=[_event("step", phase="begin"), *events, _event("step", phase="end")])


def _decoders():
    """Every decoder a consumer uses: dicts (`collect`'s summary), typed with all
    snapshot attributes (`infer`), typed with a selection (`check`, `serve`)."""
    return [decode_batch, wire_types(None).decode, wire_types(["data_digest"]).decode]


def _one_line_error(err: str, command: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[-2000:]
    assert lines[0].startswith(f"trainwatch {command}") and "Traceback" not in err
    return lines[0]


# ---------------------------------------------------------------- 2: world bomb

@pytest.mark.parametrize("decode", _decoders())
def test_a_world_beyond_the_bound_is_a_bad_value(decode):
    largest = decode(encode_batch(_step_batch(WORLD_LIMIT - 1, WORLD_LIMIT, 0)))
    assert (largest["world"] if isinstance(largest, dict) else largest.world) == WORLD_LIMIT
    for world in (WORLD_LIMIT + 1, 3_000_000):
        with pytest.raises(SchemaError) as err:
            decode(encode_batch(_step_batch(0, world, 0)))
        assert err.value.reason == "bad_value" and f"{world}" in str(err.value) and f"{WORLD_LIMIT}" in str(err.value)


def test_missing_ranks_are_counted_exactly_and_listed_briefly():
    engine = Engine(InvariantSet([]))
    window = engine.new_window("r", 0)
    for rank in (0, 5):
        engine.add_batch(window, _step_batch(rank, WORLD_LIMIT, 0))
    assert not engine.is_complete(window)
    [violation] = engine.evaluate(window, RunState("r"))
    assert violation.relation == "AllRanksReport"
    evidence = violation.evidence["first"]
    assert evidence["missing_count"] == WORLD_LIMIT - 2 and evidence["reported"] == [0, 5]
    assert violation.ranks == evidence["missing"] == [1, 2, 3, 4, 6, 7, 8, 9]
    assert len(json.dumps(violation.to_dict())) < 2_000


def test_check_of_a_world_bomb_is_one_line_and_exit_2(tmp_path, capsys):
    write_trace_dir(tmp_path, [_step_batch(0, 3_000_000, 0)])
    assert main(["check", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    line = _one_line_error(err, "check")
    assert "world size 3000000 exceeds the maximum" in line and len(out) < 1_000
