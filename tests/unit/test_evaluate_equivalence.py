"""Window evaluation gives exactly the violations recorded before it was optimised.

`Engine.evaluate` is on every streaming worker's hot path and gets tuned for speed;
tuning must never change *what* it reports.  The fixture holds closed windows (as
`WindowState` bytes, so the test does not depend on how batches are folded) from:

* synthetic data-parallel runs: healthy, every injected fault, 1-3 ranks, split and
  shuffled batches;
* the silent-bug benchmark's real PyTorch traces (bug, twin and twin-reference runs of
  every case), when the fixture was built;

and the invariant sets they are judged against: the shipped default set, a set learned
from synthetic runs and the union of the sets the silent-bug benchmark learned per
case (their Consistent-variables, state-effect and APISequence rules are rare in the
default set).  The golden file holds every window's violations (ids, ranks, stage,
evidence, counts) and the run-level facts evaluation writes.

Regenerate only when a change of *meaning* is intended::

    python tests/unit/test_evaluate_equivalence.py --regenerate [--silent-bugs-work DIR]
    python tests/unit/test_evaluate_equivalence.py --regenerate --golden-only   # same windows, new meaning
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
from pathlib import Path
from typing import Any, Iterable, Iterator

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from invariants.engine import Engine, RunState  # noqa: E402
from invariants.step_windows import StepWindows  # noqa: E402
from invariants.invariant_file import dumps, load_default_set, loads  # noqa: E402
from invariants.invariant_set import InvariantSet  # noqa: E402
from invariants.precondition import compile_precondition  # noqa: E402
from invariants.window import WindowState  # noqa: E402

DATA = ROOT / "tests" / "data" / "evaluate_equivalence"
WINDOWS_FILE = DATA / "windows.msgpack.gz"
GOLDEN_FILE = DATA / "golden.json.gz"
SET_FILES = {"default": DATA / "set-default.json", "synthetic": DATA / "set-synthetic.json",
             "silent_bugs": DATA / "set-silent-bugs.json"}
SYNTHETIC_FAULTS = ("drift", "frozen", "step_noop", "no_zero_grad", "dropout_in_eval", "reinit", "missing_rank",
                    "same_worker_seed", "allreduce_shape", "autocast_lost", "untie")


# ----------------------------------------------------------------------------- evaluation


def load_sets() -> dict[str, InvariantSet]:
    return {name: InvariantSet(loads(path.read_text(), str(path))) for name, path in SET_FILES.items()}


def load_windows() -> dict[str, list[bytes]]:
    return msgpack.unpackb(gzip.decompress(WINDOWS_FILE.read_bytes()), raw=False)


def evaluate_trace(invariant_set: InvariantSet, windows: list[bytes]) -> dict[str, Any]:
    """Every window's violations, in the order the windows closed, plus the run states."""
    engine = Engine(invariant_set)
    states: dict[str, RunState] = {}
    per_window = []
    for raw in windows:
        window = WindowState.from_bytes(raw)
        state = states.setdefault(window.run, RunState(window.run))
        per_window.append([v.to_dict() for v in engine.evaluate(window, state)])
    runs = {run: {"rank_local": s.rank_local, "variable_counts": {at: {str(r): n for r, n in per.items()}
                                                                    for at, per in s.variable_counts.items()},
                  "ties": s.ties, "violations": s.violations, "windows_closed": s.windows_closed}
            for run, s in sorted(states.items())}
    return _plain({"violations": per_window, "runs": runs})


def _plain(value: Any) -> Any:
    """The JSON form, so results compare like the golden file (tuples are lists there)."""
    return json.loads(json.dumps(value, sort_keys=True, default=repr))


# ----------------------------------------------------------------------------- the test


@pytest.fixture(scope="module")
def fixture() -> tuple[dict[str, InvariantSet], dict[str, list[bytes]], dict[str, Any]]:
    golden = json.loads(gzip.decompress(GOLDEN_FILE.read_bytes()))
    return load_sets(), load_windows(), golden


def test_fixture_covers_every_template_and_real_violations(fixture):
    sets, windows, golden = fixture
    relations = {inv.relation for s in sets.values() for inv in s.invariants}
    assert relations >= {"Consistent", "EventContain", "APISequence", "APIArg", "APIOutput", "APIAbsent",
                         "TrainingFlag", "StableVariables"}
    reported = {v["relation"] for result in golden.values() for per in result["violations"] for v in per}
    # a golden file of healthy windows only would prove nothing about evidence or ranks
    assert reported >= {"Consistent", "EventContain", "APISequence", "APIArg", "APIOutput", "APIAbsent",
                        "TrainingFlag", "StableVariables", "AllRanksReport"}
    assert any(label.startswith("bugs/") for label in windows)


@pytest.mark.parametrize("set_name", sorted(SET_FILES))
def test_evaluation_matches_the_golden_violations(fixture, set_name):
    sets, windows, golden = fixture
    mismatched = []
    for label, raw_windows in sorted(windows.items()):
        key = f"{set_name}|{label}"
        got = evaluate_trace(sets[set_name], raw_windows)
        if got != golden[key]:
            mismatched.append(_first_difference(key, got, golden[key]))
    assert not mismatched, "\n".join(mismatched[:5])


def test_inference_still_learns_the_recorded_synthetic_set():
    """Templates' sites feed inference too: speeding up checking must not change what is learned."""
    assert dumps(_learned_sets(None)["synthetic"]) == SET_FILES["synthetic"].read_text()


_MISSING = object()


def _reference_clause(kind: str, name: str, values: list, records: list[dict]) -> bool:
    """The clause semantics of `invariants.precondition`, read literally."""
    got = [record.get(name, _MISSING) for record in records]
    if kind == "exists":
        return all(v is not _MISSING and v is not None for v in got)
    if kind == "constant":
        return all(any(v == want and type(v) is type(want) for want in values) for v in got)
    if any(v is _MISSING or v is None for v in got):
        return False
    if kind == "consistent":
        return all(v == got[0] for v in got)
    try:
        return len(set(got)) == len(got)
    except TypeError:
        return False


def _reference_predicate(pre: dict, records: list[dict]) -> bool:
    held = any(all(_reference_clause(c["kind"], c["field"], c.get("values") or [], records) != c.get("negated", False)
                   for c in conj["all"]) for conj in pre["any"])
    return held != pre.get("negated", False)


_values = st.one_of(st.none(), st.booleans(), st.integers(-1, 2), st.sampled_from([0.0, 1.0, float("nan")]),
                    st.sampled_from(["train", "eval", ""]), st.lists(st.integers(0, 1), max_size=1))
_fields = st.sampled_from(["stage", "has_grad", "rank"])
_clauses = st.one_of(
    st.fixed_dictionaries({"kind": st.just("constant"), "field": _fields,
                           "values": st.lists(_values.filter(lambda v: not isinstance(v, list)), min_size=1, max_size=3),
                           "negated": st.booleans()}),
    st.fixed_dictionaries({"kind": st.sampled_from(["exists", "consistent", "unequal"]), "field": _fields,
                           "negated": st.booleans()}),
)
_preconditions = st.fixed_dictionaries({
    "negated": st.booleans(),
    "any": st.lists(st.fixed_dictionaries({"all": st.lists(_clauses, max_size=3)}), min_size=1, max_size=3),
})


@settings(max_examples=300, deadline=None)
@given(pre=_preconditions, records=st.lists(st.dictionaries(_fields, _values, max_size=3), max_size=3))
def test_compiled_preconditions_follow_the_clause_semantics(pre, records):
    assert compile_precondition(pre)(records) == _reference_predicate(pre, records)


_snapshot_values = st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.sampled_from([0.0, 1e-9, 3.5, float("nan")]),
                             st.sampled_from(["train", "eval", "torch.float32", "Linear", ""]), st.just([1, 2]))
_snapshot_attrs = st.dictionaries(
    st.sampled_from(["stage", "vtype", "mtype", "dtype", "requires_grad", "is_leaf", "grad_digest", "grad_norm",
                     "data_norm", "data_digest", "shape"]), _snapshot_values, max_size=9)
_RECORD_FIELDS = ("stage", "rank", "step_is_first", "vtype", "mtype", "dtype", "requires_grad", "is_leaf", "has_grad",
                  "grad_nonzero", "grad_significant", "args.x", "ctx.autocast")


def _same(a: Any, b: Any) -> bool:
    return a is b or (type(a) is type(b) and (a == b or (a != a and b != b)))


@settings(max_examples=300, deadline=None)
@given(attrs=_snapshot_attrs, rank=st.integers(0, 3), step=st.integers(0, 2))
def test_snapshot_records_read_like_state_records(attrs, rank, step):
    """Checking reads state records field by field (`SnapshotRecord`); every field,
    present or absent, must be what the whole record says."""
    from invariants.relations.view import WindowView

    view = WindowView(WindowState("run", step))
    whole, lazy = view.state_record(attrs, rank), view.snapshot_record(attrs, rank)
    absent = object()
    for name in _RECORD_FIELDS:
        assert _same(lazy.get(name, absent), whole.get(name, absent)), name
        assert _same(lazy.get(name), whole.get(name)), name
    assert list(lazy) == list(whole) and all(_same(lazy[k], whole[k]) for k in whole)


def _first_difference(key: str, got: dict[str, Any], want: dict[str, Any]) -> str:
    if got["runs"] != want["runs"]:
        return f"{key}: run state {got['runs']} != {want['runs']}"
    for index, (g, w) in enumerate(zip(got["violations"], want["violations"])):
        if g != w:
            return f"{key}: window {index}: got {json.dumps(g)[:600]} want {json.dumps(w)[:600]}"
    return f"{key}: {len(got['violations'])} windows, want {len(want['violations'])}"


# ----------------------------------------------------------------------------- building the fixture


def _synthetic_runs() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    from invariants.synthetic import Fault, SyntheticRun

    yield "synthetic/healthy-w1", list(SyntheticRun(run="h1", world=1, steps=5).batches())
    yield "synthetic/healthy-w2-layers3", list(SyntheticRun(run="h2", world=2, steps=5, extra_layers=3,
                                                            split_steps=False).batches())
    yield "synthetic/healthy-w3-noautocast", list(SyntheticRun(run="h3", world=3, steps=5, autocast=False,
                                                               seed=2).batches())
    for index, fault in enumerate(SYNTHETIC_FAULTS):
        world = 2 + index % 2
        faults = [Fault(fault, 2, rank=world - 1)]
        yield f"synthetic/{fault}-w{world}", list(SyntheticRun(run=f"f-{fault}", world=world, steps=5,
                                                               faults=faults, seed=index).batches())
    several = [Fault("drift", 1, 1), Fault("frozen", 2, 0), Fault("no_zero_grad", 3, 1), Fault("untie", 2, 0),
               Fault("autocast_lost", 4, 1), Fault("dropout_in_eval", 3, 0)]
    batches = list(SyntheticRun(run="many", world=2, steps=6, faults=several, extra_layers=2).batches())
    random.Random(5).shuffle(batches)
    batches.sort(key=lambda b: b["step"])  # steps in order, ranks and halves interleaved at random
    yield "synthetic/many-faults-shuffled", batches


def _silent_bug_traces(work: Path) -> Iterator[tuple[str, Iterable[dict[str, Any]]]]:
    from trainwatch.tracedir import read_trace_dir

    for case in sorted(p for p in (work / "bugs").iterdir() if p.is_dir()):
        for label in ("bug", "twin", "twin-ref"):
            trace_dir = case / label
            if trace_dir.is_dir() and any(trace_dir.glob("*.twtrace")):
                yield f"bugs/{case.name}/{label}", read_trace_dir(trace_dir)


def _closed_windows(invariant_sets: Iterable[InvariantSet], batches: Iterable[dict[str, Any]], *,
                    trace: bool) -> list[bytes]:
    """Windows as the engine closes them, folded with the union of the sets' plans."""
    union = InvariantSet([inv for s in invariant_sets for inv in s.invariants])
    closed: list[bytes] = []
    driver = StepWindows.replay(Engine(union)) if trace else StepWindows(Engine(union))
    driver.on_close = lambda window: closed.append(window.to_bytes())
    for batch in batches:
        driver.feed(batch)
    driver.finish()
    return closed


def _learned_sets(work: Path | None) -> dict[str, list]:
    from invariants.inference import infer
    from invariants.synthetic import SyntheticRun

    refs = [SyntheticRun(run="ref-a", world=2, steps=7).batches(),
            SyntheticRun(run="ref-b", world=3, steps=7, seed=1).batches()]
    learned = {"default": load_default_set().invariants, "synthetic": infer(refs), "silent_bugs": []}
    if work is not None:
        by_id = {}
        for path in sorted((work / "bugs").glob("*/inferred.json")):
            for inv in loads(path.read_text(), str(path)):
                by_id[inv.id] = inv
        learned["silent_bugs"] = list(by_id.values())
    return learned


def regenerate(work: Path | None) -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    for name, invariants in _learned_sets(work).items():
        SET_FILES[name].write_text(dumps(invariants))
    sets = load_sets()
    windows: dict[str, list[bytes]] = {}
    for label, batches in _synthetic_runs():
        windows[label] = _closed_windows(sets.values(), batches, trace=False)
    if work is not None:
        for label, batches in _silent_bug_traces(work):
            windows[label] = _closed_windows(sets.values(), batches, trace=True)
    WINDOWS_FILE.write_bytes(gzip.compress(msgpack.packb(windows, use_bin_type=True), mtime=0))
    write_golden(sets, windows)


def write_golden(sets: dict[str, InvariantSet], windows: dict[str, list[bytes]]) -> None:
    golden = {f"{name}|{label}": evaluate_trace(invariant_set, raw)
              for name, invariant_set in sets.items() for label, raw in windows.items()}
    GOLDEN_FILE.write_bytes(gzip.compress(json.dumps(golden, sort_keys=True).encode(), mtime=0))
    total = sum(len(per) for result in golden.values() for per in result["violations"])
    print(f"{len(windows)} traces, {sum(map(len, windows.values()))} windows, {total} window-violations; "
          f"windows {WINDOWS_FILE.stat().st_size} B, golden {GOLDEN_FILE.stat().st_size} B")


def main() -> int:
    parser = argparse.ArgumentParser(description="rebuild the evaluation-equivalence fixture")
    parser.add_argument("--regenerate", action="store_true", required=True)
    parser.add_argument("--silent-bugs-work", type=Path, default=ROOT / "benchmarks" / "silent_bugs" / ".work",
                        help="a silent-bug benchmark work directory with traces (skipped if absent)")
    parser.add_argument("--golden-only", action="store_true",
                        help="keep the sets and windows; re-evaluate them (a change of what a relation means)")
    args = parser.parse_args()
    if args.golden_only:
        write_golden(load_sets(), load_windows())
        return 0
    work = args.silent_bugs_work if (args.silent_bugs_work / "bugs").is_dir() else None
    regenerate(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
