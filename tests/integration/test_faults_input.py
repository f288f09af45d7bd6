"""Fault injection: hostile or damaged input at every edge where it enters.

Each test feeds one kind of bad input (an absurd world size, deep nesting, more
trace files than descriptors, badly typed invariant files, a bit flip in a trace's
last frame, an ``-i`` file that names nothing recordable) through the real decoders
and the real commands, and checks the guarantee docs/operations.md states for it: a
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

ROOT = Path(__file__).resolve().parents[2]
WORLD_LIMIT = 65_536  # the documented maximum world size (docs/operations.md, "Bounds on input")


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


# ---------------------------------------------------------------- 3: deep nesting

def _deep(levels: int) -> bytes:
    return b"\x91" * levels + b"\x00"  # [[[...[0]...]]] in msgpack


_SENTINEL = "DEEP-VALUE-HERE"


def _with_deep_value(where: str, levels: int = 3_000) -> bytes:
    """A well-formed batch whose value at ``where`` is nested ``levels`` deep."""
    marker = {"args": {"x": _SENTINEL}, "attrs": {"data_digest": _SENTINEL}, "unknown": _SENTINEL}
    if where == "call args":
        event = _event("call", name="torch.optim.Optimizer.step", api="torch.optim.Optimizer.step", phase="pre",
                       cid=1, args=marker["args"])
    elif where == "snapshot attribute":
        event = _event("state", name="w", at="step_end", attrs=marker["attrs"])
    elif where == "unknown event field":
        event = _event("meta", what="x", extra=_SENTINEL)
    else:  # an unknown batch field
        batch = _step_batch(0, 1, 0)
        batch["extra"] = _SENTINEL
        return encode_batch(batch).replace(msgpack.packb(_SENTINEL), _deep(levels))
    return encode_batch(_step_batch(0, 1, 0, event)).replace(msgpack.packb(_SENTINEL), _deep(levels))


DEEP_PLACES = ["call args", "snapshot attribute", "unknown event field", "unknown batch field"]


@pytest.mark.parametrize("where", DEEP_PLACES)
@pytest.mark.parametrize("decode", _decoders())
def test_deep_nesting_anywhere_in_a_batch_is_too_deep(decode, where):
    payload = _with_deep_value(where)
    assert len(payload) < 4_000
    with pytest.raises(SchemaError) as err:
        decode(payload)
    assert err.value.reason == "too_deep"


def test_check_of_a_deeply_nested_trace_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "rank0.twtrace").write_bytes(TRACE_MAGIC + encode_frame(_with_deep_value("call args")))
    assert main(["check", str(tmp_path)]) == 2
    line = _one_line_error(capsys.readouterr().err, "check")
    assert "rank0.twtrace" in line and "nested too deeply" in line


def _deep_json(levels: int) -> str:
    return "[" * levels + "]" * levels


INVARIANT_FILES = {
    "deep list": _deep_json(5_000).encode(),
    "deep inside a rule": json.dumps({"format": "trainwatch-invariants", "version": 1, "invariants": [
        {"relation": "APIOutput", "params": {"form": "constant", "api": "torch.nn.Module.forward", "prop": "dtype",
                                             "value": "PLACE"}}]}).replace('"PLACE"', _deep_json(2_000)).encode(),
    "not UTF-8": b'{"format": "trainwatch-invariants\xff\xfe", "version": 1, "invariants": []}',
}


def _invariants_command(command: str, path: Path) -> list[str]:
    if command == "check":
        return ["check", "-i", str(path), str(path.parent)]
    if command == "serve":  # the file is rejected before any connection is attempted
        return ["serve", "-i", str(path), "--bootstrap", "127.0.0.1:9"]
    return ["collect", "-i", str(path), "--", sys.executable, "-c", "pass"]


@pytest.mark.parametrize("kind", sorted(INVARIANT_FILES))
@pytest.mark.parametrize("command", ["check", "serve", "collect"])
def test_a_deep_or_undecodable_invariants_file_is_one_line_and_exit_2(tmp_path, capsys, command, kind):
    path = tmp_path / "inv.json"
    path.write_bytes(INVARIANT_FILES[kind])
    assert main(_invariants_command(command, path)) == 2
    line = _one_line_error(capsys.readouterr().err, command)
    assert "inv.json" in line
    assert ("UTF-8" in line) if kind == "not UTF-8" else ("nested more than" in line)


def test_serve_dead_letters_world_bombs_and_deep_nesting_and_keeps_checking(kafka_broker, tmp_path):
    from tests.support.kafka import CheckerProcess, metric, produce, produce_raw, read_topic, \
        synthetic_step_batch, wait_until

    worker = CheckerProcess(kafka_broker.bootstrap, tmp_path / "w.log",
                            ["--grace-seconds", "1", "--partitions", "2", "--data-dir", str(tmp_path / "w")]).start()
    try:
        hostile = [encode_batch(_step_batch(0, 3_000_000, 0)), *(_with_deep_value(w) for w in DEEP_PLACES)]
        produce_raw(kafka_broker.bootstrap, "trainwatch.events", [(b"r:0", value) for value in hostile])
        produce(kafka_broker.bootstrap, "trainwatch.events", [synthetic_step_batch("run-ok", 0, 1, s) for s in range(3)])
        dead = wait_until(lambda: (r := read_topic(kafka_broker.bootstrap, "trainwatch.dead-letter"))
                          and len(r) >= len(hostile) and r, 60, what="a dead-letter record per hostile message")
        reasons = collections.Counter(msgpack.unpackb(r.value, raw=False)["reason"] for r in dead)
        assert reasons == {"bad_value": 1, "too_deep": len(DEEP_PLACES)}
        samples = wait_until(lambda: (m := worker.metrics())
                             and metric(m, "trainwatch_steps_checked_total", run="run-ok") >= 3 and m,
                             60, what="the healthy run checked after the hostile input")
        assert metric(samples, "trainwatch_dead_letters_total", reason="too_deep") == len(DEEP_PLACES)
        assert worker.proc.poll() is None
        assert "Traceback" not in worker.log_text()
    finally:
        worker.stop()


# ---------------------------------------------------------------- 8: descriptor limit

def _many_rank_trace(directory: Path, ranks: int, steps: int = 2) -> None:
    """A setup window, then training iterations (so that ``check`` has something to judge)."""
    batches = []
    for step in range(steps):
        for rank in range(ranks):
            batch = _step_batch(rank, ranks, step)
            batch["events"][-1].update({"setup": True} if step == 0 else {"trained": True, "boundary": "optimizer"})
            batches.append(batch)
    write_trace_dir(directory, batches)


def test_merging_with_few_descriptors_gives_the_same_batches(tmp_path):
    _many_rank_trace(tmp_path, 12, steps=3)
    order = [(b["step"], b["rank"]) for b in read_trace_dir(tmp_path)]
    assert order == [(b["step"], b["rank"]) for b in read_trace_dir(tmp_path, max_open_files=2)]
    assert sorted(order) == [(step, rank) for step in range(3) for rank in range(12)]
    assert [o[0] for o in order] == sorted(o[0] for o in order)


def test_check_reads_more_trace_files_than_it_may_open(tmp_path):
    """1,500 files under the usual ``ulimit -n 1024``, scaled down: 300 under 128."""
    _many_rank_trace(tmp_path / "t", 300)
    limit = 128

    def lower_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    done = subprocess.run([sys.executable, "-m", "trainwatch.cli", "check", str(tmp_path / "t")],
                          capture_output=True, text=True, timeout=300, preexec_fn=lower_limit, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Too many open files" not in done.stderr and done.stdout.startswith("OK")


# ---------------------------------------------------------------- 11: invariant file types

APIARG = {"relation": "APIArg", "params": {"form": "ranks", "api": "torch.optim.Optimizer.step", "arg": "lr"}}


def _doc(*items: dict, **extra) -> str:
    return json.dumps({"format": "trainwatch-invariants", "version": 1, "invariants": list(items), **extra})


@pytest.mark.parametrize("text, field, words", [
    (_doc(dict(APIARG, params=dict(APIARG["params"], api=5))), "params.api", "must be a non-empty string, got an integer"),
    (_doc(dict(APIARG, params=dict(APIARG["params"], arg=None))), "params.arg", "got null"),
    (_doc(dict(APIARG, params=dict(APIARG["params"], ap="x"))), "params.ap", "unknown parameter for relation APIArg"),
    (_doc({"relation": "APIAbsent", "params": {"api": "torch.manual_seed", "stage": "train", "after_step": True}}),
     "params.after_step", "must be an integer"),
    (_doc({"relaton": "APIArg", "params": APIARG["params"]}), "relation", "missing field"),
    (_doc({"params": APIARG["params"]}), "relation", "missing field"),
    (_doc(dict(APIARG, relation=7)), "relation", "must be a string"),
    (_doc(dict(APIARG, descripton="typo")), "descripton", "unknown key"),
    (_doc(APIARG, comment="top-level typo"), "comment", "unknown key"),
])
def test_badly_typed_or_unknown_invariant_fields_are_named(text, field, words):
    with pytest.raises(InvariantFileError) as err:
        loads(text, "my.json")
    assert err.value.field == field and words in str(err.value)


def test_every_relation_declares_its_parameter_types_and_the_shipped_set_follows_them():
    from invariants.param_schema import PARAMS
    from invariants.relations import TEMPLATES

    assert set(PARAMS) == set(TEMPLATES)
    assert loads(dumps(load_default_set().invariants))  # typed checks accept every shipped rule


def test_check_names_the_badly_typed_field_in_one_line(tmp_path, capsys):
    path = tmp_path / "inv.json"
    path.write_text(_doc(dict(APIARG, params=dict(APIARG["params"], api=5))))
    write_trace_dir(tmp_path, [_step_batch(0, 1, 0)])
    assert main(["check", "-i", str(path), str(tmp_path)]) == 2
    assert "field 'params.api'" in _one_line_error(capsys.readouterr().err, "check")


# ---------------------------------------------------------------- 12: bit flip in the last frame

def test_a_bit_flip_in_the_last_frame_is_corruption_and_a_cut_is_truncation():
    frames = [encode_frame(b"a" * 10), encode_frame(b"b" * 10)]
    data = bytearray(TRACE_MAGIC + b"".join(frames))
    data[-3] ^= 0x01
    with pytest.raises(TraceCorruption) as err:
        list(iter_frames(io.BytesIO(bytes(data))))
    assert err.value.offset == len(TRACE_MAGIC) + len(frames[0])
    scan = FrameScan()
    assert list(iter_frames(io.BytesIO(bytes(data[:-3])), scan)) == [b"a" * 10]
    assert scan.truncated_at == len(TRACE_MAGIC) + len(frames[0])


def test_check_of_a_trace_with_a_flipped_last_frame_exits_2_without_a_missing_rank(tmp_path, capsys):
    paths = write_trace_dir(tmp_path, SyntheticRun(run="flip", world=2, steps=3).batches())
    data = bytearray(paths[1].read_bytes())
    data[-5] ^= 0x10  # inside the payload of rank 1's last frame, which holds its last step end
    paths[1].write_bytes(bytes(data))
    assert main(["check", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    line = _one_line_error(err, "check")
    assert "checksum mismatch" in line and str(paths[1]) in line
    assert "AllRanksReport" not in out and "torn" not in out


# ---------------------------------------------------------------- 13: collect -i

@pytest.mark.parametrize("text, named", [
    ("This file lists what we train.\nSee the wiki.\n", "'This file lists what we train.' (line 1)"),
    ("torch.optim.Optimizer.zero_grad\ntorch.optim.Optimizer.stepp  # typo\n", "'torch.optim.Optimizer.stepp' (line 2)"),
    ("torch.nn.Module.eval\nmylib.train_step\n", "'mylib.train_step' (line 2)"),
])
def test_collect_rejects_an_api_list_naming_what_it_cannot_record(tmp_path, capsys, text, named):
    path = tmp_path / "apis.txt"
    path.write_text(text)
    assert main(["collect", "-i", str(path), "--", sys.executable, "-c", "pass"]) == 2
    line = _one_line_error(capsys.readouterr().err, "collect")
    assert named in line and "apis.txt" in line


def test_collect_rejects_json_that_is_not_an_invariants_file(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model": "resnet", "apis": ["torch.save"]}))
    assert main(["collect", "-i", str(path), "--", sys.executable, "-c", "pass"]) == 2
    assert "config.json" in _one_line_error(capsys.readouterr().err, "collect")


def test_an_api_list_of_recordable_names_is_accepted():
    from producers.selection import is_known_api

    assert is_known_api("torch.optim.Optimizer.zero_grad")  # a default family
    assert is_known_api("torch.matmul") and is_known_api("torch.nn.functional.relu")  # via the function mode
    assert is_known_api("torch.Tensor.add_")
    for name in ("torch.matmull", "torch", "os.system", "torch.optim.Adam.step", "torch.nn.Linear"):
        assert not is_known_api(name), name  # Adam.step is recorded as the family torch.optim.Optimizer.step
