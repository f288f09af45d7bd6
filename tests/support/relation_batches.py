"""What the relation-template tests share: the rules learned once from healthy synthetic runs,
an offline check of batches against rules, and a builder for steps made of plain calls.

Learning is cached per process because every template's tests start from the same two
reference runs, and inferring them again per test module would only cost time.
"""

from __future__ import annotations

import functools

from invariants.engine import Engine
from invariants.step_windows import StepWindows
from invariants.events import make_batch
from invariants.inference import infer
from invariants.invariant_set import InvariantSet
from invariants.model import Invariant
from invariants.synthetic import SyntheticRun


@functools.lru_cache(maxsize=None)
def learned() -> tuple[Invariant, ...]:
    refs = [
        SyntheticRun(run="ref-a", world=2, steps=8).batches(),
        SyntheticRun(run="ref-b", world=3, steps=8, seed=1).batches(),
    ]
    return tuple(infer(refs))


def check(invariants, batches) -> list:
    windows = StepWindows(Engine(InvariantSet(invariants)))
    found = []
    for batch in batches:
        found.extend(windows.feed(batch))
    found.extend(windows.finish())
    return found


def find(relation: str, **params) -> Invariant:
    matches = [inv for inv in learned() if inv.relation == relation and all(inv.params.get(k) == v for k, v in params.items())]
    assert matches, f"no {relation} {params} learned"
    return matches[0]


def call_batch(step: int, calls: list[dict], *, rank: int = 0, world: int = 1) -> dict:
    events = []
    cid = step * 100
    for call in calls:
        cid += 1
        base = {"kind": "call", "t": cid, "pid": 1, "tid": 1, "stage": "train", "name": call["api"], "api": call["api"],
                "cid": cid, "parent": None, "ctx": {}}
        events.append(dict(base, phase="pre", args=call.get("args", {})))
        events.append(dict(base, phase="post", ret=call.get("ret")))
    events.append({"kind": "step", "t": cid + 50, "pid": 1, "tid": 1, "stage": "train", "phase": "end"})
    return make_batch(run="gen", rank=rank, world=world, step=step, seq=step, events=events)
