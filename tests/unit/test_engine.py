"""The step-window engine: completion, missing ranks, late batches, state bytes, order independence."""

from __future__ import annotations

import functools
import random

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from invariants.engine import Engine, RunState
from invariants.step_windows import StepWindows
from invariants.inference import Inferencer, infer
from invariants.invariant_set import InvariantSet
from invariants.model import Invariant, Violation
from invariants.synthetic import Fault, SyntheticRun
from invariants.window import WindowState

CROSS_RANK = Invariant("Consistent", {"scope": "ranks", "at": "post:torch.optim.Optimizer.step", "attr": "data_digest"})


@functools.lru_cache(maxsize=None)
def learned_set() -> InvariantSet:
    refs = [SyntheticRun(run="ref-a", world=2, steps=7).batches(), SyntheticRun(run="ref-b", world=3, steps=7, seed=1).batches()]
    return InvariantSet(infer(refs))


def replay(invariant_set: InvariantSet, batches) -> list[dict]:
    windows = StepWindows(Engine(invariant_set))
    found = []
    for batch in batches:
        found.extend(windows.feed(batch))
    found.extend(windows.finish())
    return sorted((v.to_dict() for v in found), key=lambda d: (d["run"], d["step"], d["invariant"]))


def test_window_closes_when_every_rank_reports_the_step_end():
    engine = Engine(InvariantSet([CROSS_RANK]))
    batches = [b for b in SyntheticRun(world=3, steps=1).batches()]
    window = engine.new_window("run-a", 0)
    for batch in batches[:-1]:
        engine.add_batch(window, batch)
        assert not engine.is_complete(window)
    engine.add_batch(window, batches[-1])
    assert engine.is_complete(window)
    assert engine.evaluate(window, RunState("run-a")) == []


def test_window_waits_for_the_dataloader_workers_a_rank_announced():
    """Forked workers report over their own connections, after their rank's step end;
    a step judged without them could not see two workers sharing a seed."""
    engine = Engine(InvariantSet([CROSS_RANK]))
    window = engine.new_window("run-a", 0)
    rank_events = [{"kind": "meta", "t": 1, "pid": 10, "tid": 1, "stage": "train", "what": "dataloader_workers",
                    "workers": 2},
                   {"kind": "step", "t": 2, "pid": 10, "tid": 1, "stage": "train", "phase": "end"}]
    engine.add_batch(window, {"v": 1, "run": "run-a", "rank": 0, "world": 1, "step": 0, "seq": 0,
                              "events": rank_events})
    assert window.missing_ranks() == [] and window.missing_workers() == 2
    assert not engine.is_complete(window)
    for pid in (11, 11, 12):  # a worker's second batch does not count twice
        report = {"kind": "call", "t": 3, "pid": pid, "tid": 1, "stage": "train", "name": "worker_loop",
                  "api": "torch.utils.data.worker_init", "phase": "post", "cid": 1, "args": {"worker_id": pid}}
        engine.add_batch(window, {"v": 1, "run": "run-a", "rank": 0, "world": 1, "step": 0, "seq": 0,
                                  "events": [report]})
        assert engine.is_complete(window) is (pid == 12)
    assert WindowState.from_bytes(window.to_bytes()).missing_workers() == 0


def test_rank_missing_at_close_is_reported_with_the_ranks_that_did_report():
    run = SyntheticRun(world=3, steps=3, faults=[Fault("missing_rank", 1, rank=2)])
    windows = StepWindows(Engine(InvariantSet([CROSS_RANK])))
    early = []
    for batch in run.batches():
        early.extend(windows.feed(batch))
    assert early == []  # step 1 stays open: rank 2 never ended it
    assert ("run-a", 1) in windows.windows
    late = windows.finish()
    assert [(v.relation, v.step, v.ranks) for v in late] == [("AllRanksReport", 1, [2])]
    assert late[0].evidence["first"]["reported"] == [0, 1]


def test_grace_steps_force_close_a_stalled_window():
    run = SyntheticRun(world=2, steps=5, faults=[Fault("missing_rank", 1, rank=0)])
    windows = StepWindows(Engine(InvariantSet([CROSS_RANK])), grace_steps=2)
    found = []
    for batch in run.batches():
        found.extend(windows.feed(batch))
        if batch["step"] == 3:
            assert ("run-a", 1) not in windows.windows
    assert [(v.relation, v.step) for v in found] == [("AllRanksReport", 1)]


def test_batch_for_a_closed_step_is_counted_late_and_dropped():
    batches = list(SyntheticRun(world=2, steps=2).batches())
    windows = StepWindows(Engine(InvariantSet([CROSS_RANK])))
    for batch in batches:
        windows.feed(batch)
    assert windows.run_state("run-a").is_closed(0)
    assert windows.feed(batches[0]) == []
    assert windows.late_batches == 1
    assert not windows.windows


def test_run_state_watermark_and_bytes():
    state = RunState("r")
    for step in (0, 2, 1, 5):
        state.mark_closed(step)
    assert state.closed_below == 3 and state.closed_above == {5}
    assert state.is_closed(1) and state.is_closed(5) and not state.is_closed(4)
    copy = RunState.from_bytes(state.to_bytes())
    assert copy.closed_below == 3 and copy.closed_above == {5}


def test_window_keeps_only_planned_facts():
    invariant_set = InvariantSet([CROSS_RANK])
    window = WindowState("run-a", 0)
    raw = 0
    for batch in SyntheticRun(world=2, steps=1).batches():
        window.add_batch(batch, invariant_set.plan)
        raw += len(msgpack.packb(batch))
    assert all(not facts.calls for facts in window.ranks.values())
    # the judged point, and the gradients before the update that tell shards from replicas
    assert set(window.ranks[0].states) == {"post:torch.optim.Optimizer.step", "pre:torch.optim.Optimizer.step"}
    assert len(window.to_bytes()) < raw / 4


def test_window_state_round_trips_through_bytes():
    invariant_set = learned_set()
    batches = list(SyntheticRun(world=2, steps=1).batches())
    window = WindowState("run-a", 0)
    for batch in batches:
        window.add_batch(batch, invariant_set.plan)
    copy = WindowState.from_bytes(window.to_bytes())
    assert copy.to_bytes() == window.to_bytes()
    engine = Engine(invariant_set)
    assert engine.evaluate(copy, RunState("run-a")) == engine.evaluate(window, RunState("run-a"))


def test_rank_facts_keep_their_stored_map():
    """Window bytes written as plain rank maps (fixtures, a checker's changelog) restore,
    and facts nobody reported are not stored."""
    stored = {"ended": True, "stage": "train", "calls": [{"api": "f", "key": "1:1", "o": [0, 0]}], "links": {},
              "states": {}, "worker_pids": [7], "run_end": [3, None], "unknown_later": 1}
    raw = msgpack.packb(["r", 2, 1, 1, 1, {0: stored, 1: {"ended": False, "stage": "", "calls": [], "links": {},
                                                         "states": {}}}], use_bin_type=True)
    window = WindowState.from_bytes(raw)
    assert window.ranks[0].ended and window.ranks[0].worker_pids == [7] and window.ranks[0].run_end == [3, None]
    assert window.ranks[1].workers_expected == 0 and window.ranks[1].trained is None
    _, _, _, _, _, ranks = msgpack.unpackb(window.to_bytes(), raw=False, strict_map_key=False)
    assert ranks[0] == {k: v for k, v in stored.items() if k != "unknown_later"}
    assert set(ranks[1]) == {"ended", "stage", "calls", "links", "states"}


def test_violation_dict_round_trip_and_stable_id():
    v = Violation("inv-1", "Consistent", "d", "run", 3, [1], "train", {"x": 1}, "h")
    again = Violation.from_dict(v.to_dict())
    assert again == v
    assert Violation("inv-1", "Consistent", "other words", "run", 3, [0], "eval", {}, "").id == v.id
    assert Violation("inv-1", "Consistent", "d", "run", 4, [1], "train", {}, "").id != v.id


FAULTS = ["drift", "frozen", "no_zero_grad", "missing_rank", "reinit", "allreduce_shape", "autocast_lost", None]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fault=st.sampled_from(FAULTS),
    fault_step=st.integers(1, 3),
    world=st.integers(2, 3),
    seed=st.integers(0, 2**16),
    snapshot_at=st.floats(0, 1),
)
def test_any_arrival_and_close_order_gives_the_sorted_replay_violations(fault, fault_step, world, seed, snapshot_at):
    invariant_set = learned_set()
    faults = [Fault(fault, fault_step, rank=world - 1)] if fault else []
    batches = list(SyntheticRun(run="live", world=world, steps=5, faults=faults, seed=7).batches())
    expected = replay(invariant_set, sorted(batches, key=lambda b: (b["step"], b["rank"], b["seq"])))
    if fault:
        assert expected, f"fault {fault} produced no violation"

    rng = random.Random(seed)
    # Kafka keeps order only within one (rank, step) stream; everything else may interleave.
    queues: dict[tuple[int, int], list[dict]] = {}
    for batch in batches:
        queues.setdefault((batch["rank"], batch["step"]), []).append(batch)
    arrival = []
    while queues:
        key = rng.choice(sorted(queues))
        arrival.append(queues[key].pop(0))
        if not queues[key]:
            del queues[key]

    # fold everything without closing, snapshot/restore mid-stream, then close in random order
    engine = Engine(invariant_set)
    windows: dict[tuple[str, int], WindowState] = {}
    cut = int(snapshot_at * len(arrival))
    for index, batch in enumerate(arrival):
        if index == cut:
            windows = {k: WindowState.from_bytes(w.to_bytes()) for k, w in windows.items()}
        key = (batch["run"], batch["step"])
        window = windows.get(key) or windows.setdefault(key, engine.new_window(*key))
        engine.add_batch(window, batch)
    run_state = RunState("live")
    order = sorted(windows)
    rng.shuffle(order)
    found = []
    for key in order:
        run_state = RunState.from_bytes(run_state.to_bytes())
        found.extend(engine.evaluate(windows.pop(key), run_state))
    got = sorted((v.to_dict() for v in found), key=lambda d: (d["run"], d["step"], d["invariant"]))
    assert got == expected
    assert run_state.windows_closed == 5 and run_state.closed_below == 5


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), cut=st.floats(0, 1))
def test_step_windows_snapshot_restore_mid_stream_changes_nothing(seed, cut):
    invariant_set = learned_set()
    batches = list(SyntheticRun(run="live", world=2, steps=5, faults=[Fault("drift", 2, 1)]).batches())
    random.Random(seed).shuffle(batches)
    batches.sort(key=lambda b: (b["rank"], b["step"], b["seq"]))  # per-rank order kept, ranks sequential
    expected = replay(invariant_set, batches)
    first = StepWindows(Engine(invariant_set))
    found = []
    split = int(cut * len(batches))
    for batch in batches[:split]:
        found.extend(first.feed(batch))
    second = StepWindows(Engine(invariant_set))
    second.restore(first.to_bytes())
    for batch in batches[split:]:
        found.extend(second.feed(batch))
    found.extend(second.finish())
    assert sorted((v.to_dict() for v in found), key=lambda d: (d["run"], d["step"], d["invariant"])) == expected


odd_values = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=True), st.text(max_size=3),
                       st.lists(st.integers(0, 3), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(0, 2), max_size=2))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_contract_valid_but_odd_events_never_crash_the_engine(data):
    """Optional fields with unexpected types or missing are 'unknown', never an exception."""
    invariant_set = learned_set()
    batches = list(SyntheticRun(run="odd", world=2, steps=2).batches())
    for batch in batches:
        for event in batch["events"]:
            if data.draw(st.integers(0, 9)) == 0:
                for key in data.draw(st.lists(st.sampled_from(
                        ["args", "ret", "ctx", "parent", "module", "mtype", "training", "at", "vtype", "api", "cid_extra"]), max_size=3)):
                    if data.draw(st.booleans()):
                        event.pop(key, None)
                    else:
                        event[key] = data.draw(odd_values)
            if event["kind"] == "state" and data.draw(st.integers(0, 9)) == 0:
                attr = data.draw(st.sampled_from(["data_digest", "grad_digest", "grad_norm", "data_norm", "numel", "shape",
                                                  "mtype", "dtype", "requires_grad"]))
                event["attrs"][attr] = data.draw(odd_values)
    windows = StepWindows(Engine(invariant_set))
    for batch in batches:
        windows.feed(batch)
    for violation in windows.finish():
        assert isinstance(violation.to_dict(), dict)
        msgpack.packb(violation.to_dict(), use_bin_type=True, default=str)
    inferencer = Inferencer()
    inferencer.add_trace(batches)
    inferencer.finish()


def test_post_event_keyword_arguments_join_the_call_arguments():
    from invariants.events import make_batch
    from invariants.window import FactPlan, WindowState

    base = {"kind": "call", "pid": 1, "tid": 1, "stage": "eval", "name": "Sampler.forward",
            "api": "torch.nn.Module.forward", "cid": 7, "parent": None, "mtype": "Sampler"}
    events = [dict(base, t=1, phase="pre", args={"0": "prompt"}),
              dict(base, t=2, phase="post", kwargs={"max_new_tokens": 6, "0": "not this", "top_k": 3}, ret=None)]
    batch = make_batch(run="r", rank=0, world=1, step=0, seq=0, events=events)
    everything = WindowState("r", 0)
    everything.add_batch(batch, FactPlan.everything())
    assert everything.ranks[0].calls[0]["args"] == {"0": "prompt", "max_new_tokens": 6, "top_k": 3}
    planned = WindowState("r", 0)
    planned.add_batch(batch, FactPlan(apis={"torch.nn.Module.forward"}, args={"torch.nn.Module.forward": {"max_new_tokens"}}))
    restored = WindowState.from_bytes(planned.to_bytes())
    assert restored.ranks[0].calls[0]["args"] == {"max_new_tokens": 6}


def test_a_rank_that_ended_its_run_is_not_missing_from_later_steps():
    """Ranks with uneven work (a federated client with fewer rounds, a rank with less
    data) end their runs at different steps: the one done first reported its run's end
    (the producer ends the window it ends in) and is not stalled.  A rank that stops reporting without ending its run still is."""
    from invariants.events import make_batch
    from tests.support.relation_batches import check, learned

    def run(ends_its_run: bool) -> list:
        batches = [b for b in SyntheticRun(run="uneven", world=2, steps=8, seed=5).batches()
                   if not (b["rank"] == 1 and b["step"] > 4)]
        if ends_its_run:
            run_end = {"kind": "meta", "t": 9_999_999, "pid": 1001, "tid": 1, "stage": "train", "what": "run_end",
                       "iterations": 5, "optimizer_steps": 5}
            tail_end = {"kind": "step", "t": 9_999_999, "pid": 1001, "tid": 1, "stage": "train", "phase": "end"}
            batches.append(make_batch(run="uneven", rank=1, world=2, step=5, seq=99, events=[run_end, tail_end]))
            batches.sort(key=lambda b: (b["step"], b["rank"]))
        return [v for v in check(learned(), batches) if v.relation == "AllRanksReport"]

    assert sorted(v.step for v in run(ends_its_run=False)) == [5, 6, 7]
    assert run(ends_its_run=True) == []
    state = RunState("uneven")
    state.ended_runs = {1: 5}
    assert RunState.from_bytes(state.to_bytes()).ended_runs == {1: 5}
