"""The step recorder keeps the batch contract under any mix of early flushes and cuts."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from invariants.codec import decode_batch
from invariants.events import validate_batch
from producers.recorder import StepRecorder
from producers.sinks import SinkStats


class MemorySink:
    name = "memory"

    def __init__(self) -> None:
        self.payloads: list[bytes] = []

    def write(self, batch, payload) -> None:
        self.payloads.append(payload)

    def stats(self) -> SinkStats:
        return SinkStats(sent_batches=len(self.payloads))

    def close(self, timeout_s: float) -> None:
        pass


def _event(label: int) -> dict:
    return {"kind": "meta", "t": 1, "pid": 1, "tid": 1, "stage": "train", "what": "mark", "label": label}


def _marker(phase: str) -> dict:
    return {"kind": "step", "t": 1, "pid": 1, "tid": 1, "stage": "train", "phase": phase}


operations = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 7)),
        st.tuples(st.just("end"), st.none()),
        st.tuples(st.just("cut"), st.integers(0, 30)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops=operations, max_events=st.integers(2, 9))
def test_every_event_lands_once_in_its_step_and_each_step_ends_its_last_batch(ops, max_events):
    sink = MemorySink()
    recorder = StepRecorder("run", 0, 1, [sink], max_events_per_batch=max_events)
    label = 0
    expected_steps: dict[int, int] = {}  # label -> the step whose batch must carry it
    open_items: list[int | None] = []  # the open step's events in order (None = begin marker)
    flushed = 0  # a prefix of open_items already shipped early
    step = 0
    for op, arg in ops:
        if op == "append":
            for _ in range(arg):
                recorder.append(_event(label))
                open_items.append(label)
                label += 1
                if len(open_items) - flushed >= max_events:  # shipped early, still in this step
                    for item in open_items[flushed:]:
                        if item is not None:
                            expected_steps[item] = step
                    flushed = len(open_items)
        else:
            cut = len(open_items) if op == "end" else min(max(arg, flushed), len(open_items))
            for item in open_items[flushed:cut]:
                if item is not None:
                    expected_steps[item] = step
            recorder.end_step(_marker("end"), at=None if op == "end" else arg, next_begin=_marker("begin"))
            open_items = [None] + open_items[cut:]
            flushed = 0
            step += 1
    batches = [validate_batch(decode_batch(p)) for p in sink.payloads]
    assert [b["seq"] for b in batches] == list(range(len(batches)))
    seen: dict[int, int] = {}
    for batch in batches:
        for event in batch["events"]:
            if event["kind"] == "meta":
                assert event["label"] not in seen, "no event is shipped twice"
                seen[event["label"]] = batch["step"]
    assert seen == expected_steps, "every flushed event is in the step it belongs to"
    steps = sorted({b["step"] for b in batches})
    for step in steps:
        mine = [b for b in batches if b["step"] == step]
        ends = [i for i, b in enumerate(mine) for e in b["events"] if e["kind"] == "step" and e["phase"] == "end"]
        if step < recorder.step:
            assert ends == [len(mine) - 1] and mine[-1]["events"][-1]["phase"] == "end"
    assert [b["step"] for b in batches] == sorted(b["step"] for b in batches), "steps never go back"


class InFlight:
    """A value still on its way from a device: lands when resolved, or when told."""

    def __init__(self, event: dict) -> None:
        self.event = event
        self.landed = False

    def ready(self) -> bool:
        return self.landed

    def resolve(self) -> None:
        self.event["value"] = "filled"
        self.landed = True


def _awaiting(recorder: StepRecorder, label: int) -> InFlight:
    event = _event(label)
    pending = InFlight(event)
    recorder.await_readback(pending)
    recorder.append(event)
    return pending


def test_values_in_flight_hold_their_batch_until_the_next_step_end_and_keep_seq_order():
    sink = MemorySink()
    recorder = StepRecorder("run", 0, 1, [sink], max_events_per_batch=3)
    _awaiting(recorder, 1)
    recorder.end_step(_marker("end"))
    assert sink.payloads == [], "step 0 waits for its value"
    for label in (2, 3, 4):  # an early flush of step 1 queues behind step 0
        recorder.append(_event(label))
    assert sink.payloads == []
    recorder.end_step(_marker("end"))
    batches = [decode_batch(p) for p in sink.payloads]
    assert [(b["step"], b["seq"]) for b in batches] == [(0, 0), (1, 1), (1, 2)]
    assert batches[0]["events"][0]["value"] == "filled"

    _awaiting(recorder, 5).landed = True  # landed before its step ended: ships at once
    recorder.end_step(_marker("end"))
    assert decode_batch(sink.payloads[-1])["step"] == 2
    _awaiting(recorder, 6)
    recorder.end_step(_marker("end"))
    assert len(sink.payloads) == 4
    recorder.close_sinks(1.0)
    last = decode_batch(sink.payloads[-1])
    assert (last["step"], last["seq"], last["events"][0]["value"]) == (3, 4, "filled")


def test_a_forked_child_never_ships_its_parents_held_batches():
    sink = MemorySink()
    recorder = StepRecorder("run", 0, 1, [sink])
    _awaiting(recorder, 1)
    recorder.end_step(_marker("end"))
    recorder.reset_after_fork()
    recorder.close_sinks(1.0)
    assert sink.payloads == []
