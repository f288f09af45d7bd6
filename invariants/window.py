"""One (run, step) window: the facts of every rank's events for that step, folded small.

A window never keeps raw event lists.  `FactPlan` says which facts the deployed
invariants can ever look at (which APIs, which snapshot points, which attributes and
arguments); `WindowState.add_batch` keeps exactly those.  For inference the plan is
`FactPlan.everything()`.  Each rank's facts are a `RankFacts`; the state
round-trips through msgpack (`to_bytes`/`from_bytes`) and can live in a Faust table
with a changelog.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from .coverage import note_meta, note_step_end
from .events import DATALOADER_WORKERS_META, OPTIMIZER_STEP, WORKER_INIT_API
from .rank_facts import RankFacts
from .wire import UNSET, payload, wire_types

#: Snapshot attributes worth keeping for preconditions and evidence, besides digests.
BASE_STATE_ATTRS = ("requires_grad", "dtype", "mtype", "is_leaf", "shape")
#: How many rank numbers a completeness report names; the count is always exact.  A
#: window of a large job missing most ranks must not produce a list per rank.
LISTED_RANKS = 8


@dataclass
class FactPlan:
    """Which facts a window must keep.  ``None`` fields mean "all" (inference)."""

    apis: set[str] | None = field(default_factory=set)
    #: api -> argument names to keep (None = all arguments of that API)
    args: dict[str, set[str] | None] = field(default_factory=dict)
    state_points: set[str] | None = field(default_factory=set)
    state_attrs: set[str] | None = field(default_factory=set)
    links: bool = False

    @classmethod
    def everything(cls) -> "FactPlan":
        return cls(apis=None, args={}, state_points=None, state_attrs=None, links=True)

    def merge(self, other: "FactPlan") -> None:
        if self.apis is not None:
            self.apis = None if other.apis is None else self.apis | other.apis
        for api, names in other.args.items():
            if api in self.args and self.args[api] is None:
                continue
            self.args[api] = None if names is None else (self.args.get(api) or set()) | names
        if self.state_points is not None:
            self.state_points = None if other.state_points is None else self.state_points | other.state_points
        if self.state_attrs is not None:
            self.state_attrs = None if other.state_attrs is None else self.state_attrs | other.state_attrs
        self.links = self.links or other.links

    def kept_attrs(self) -> tuple[str, ...] | None:
        """Snapshot attributes a window keeps (None = all): the decoder's selection."""
        if self.state_attrs is None:
            return None
        return BASE_STATE_ATTRS + tuple(sorted(self.state_attrs - set(BASE_STATE_ATTRS)))

    def keeps_args(self, api: str) -> set[str] | None | bool:
        """None = all args, a set = those names, False = none."""
        if self.apis is None:
            return None
        if api not in self.args:
            return False
        return self.args[api]


class WindowState:
    """Everything a window knows; mutated only by `add_batch`."""

    __slots__ = ("run", "step", "world", "ranks", "batches", "events")

    def __init__(self, run: str, step: int, world: int = 0) -> None:
        self.run = run
        self.step = step
        self.world = world
        self.ranks: dict[int, RankFacts] = {}
        self.batches = 0
        self.events = 0

    # ------------------------------------------------------------------ folding
    def rank(self, rank: int) -> RankFacts:
        facts = self.ranks.get(rank)
        if facts is None:
            facts = self.ranks[rank] = RankFacts()
        return facts

    def add_batch(self, batch: Any, plan: FactPlan) -> None:
        """Fold one validated batch of one rank into the window.

        ``batch`` is a typed batch (`wire`) whose snapshot attributes were already
        narrowed to the plan's by the decoder — the attribute maps are kept as decoded,
        not copied — or a dict batch (tests, in-memory runs), converted first.
        """
        if isinstance(batch, dict):
            batch = wire_types(plan.kept_attrs()).convert(batch)
        self.world = max(self.world, batch.world)
        self.batches += 1
        events = batch.events
        self.events += len(events)
        facts = self.rank(batch.rank)
        seq = batch.seq
        calls = facts.calls
        links = facts.links
        states = facts.states
        open_calls: dict[str, dict[str, Any]] = {}
        apis = plan.apis
        points = plan.state_points
        keep_links = plan.links
        # a snapshot point's variables come one after another: look its map up once
        snapshot: tuple[Any, Any, Any] = (None, None, None)
        per_call: dict[str, Any] = {}
        for index, event in enumerate(events):
            kind = event.KIND
            if kind == "state":
                at = event.at
                cid = event.cid
                if (at, cid, event.pid) != snapshot:
                    snapshot = (at, cid, event.pid)
                    if at.__class__ is not str:
                        at = ""
                    if points is not None and at not in points:
                        per_call = None
                    else:
                        call_key = "-" if cid is None else f"{event.pid}:{cid}"
                        per_point = states.get(at)
                        if per_point is None:
                            per_point = states[at] = {}
                        per_call = per_point.get(call_key)
                        if per_call is None:
                            per_call = per_point[call_key] = {}
                if per_call is None:
                    continue
                kept = event.attrs
                kept["stage"] = event.stage
                if event.vtype is not UNSET:
                    kept["vtype"] = event.vtype
                per_call[event.name] = kept
            elif kind == "call":
                # invariants key on the stable family name when the producer gives one
                api = event.api
                if api.__class__ is not str or not api:
                    api = event.name
                phase = event.phase
                key = f"{event.pid}:{event.cid}"
                if api == WORKER_INIT_API:
                    reported = facts.worker_pids
                    if event.pid not in reported:
                        reported.append(event.pid)
                elif api == OPTIMIZER_STEP and phase == "pre":  # coverage of producers without `trained`
                    facts.optimizer_steps += 1
                if keep_links and phase == "pre":
                    parent = event.parent
                    links[key] = None if parent is None else f"{event.pid}:{parent}"
                if apis is not None and api not in apis:
                    continue
                if phase == "pre":
                    fact = self._call_fact(event, api, key, seq, index, plan)
                    calls.append(fact)
                    open_calls[key] = fact
                else:
                    fact = open_calls.get(key) or self._find_call(calls, key)
                    if fact is None:  # post without pre (pre in an earlier step): keep what we have
                        fact = self._call_fact(event, api, key, seq, index, plan)
                        calls.append(fact)
                    fact["done"] = True
                    if event.kwargs is not None:
                        self._fold_kwargs(fact, payload(event.kwargs), api, plan)
                    if phase == "exc":
                        fact["exc"] = True
                    elif event.ret is not UNSET:
                        fact["ret"] = payload(event.ret)
            elif kind == "step":
                if event.phase == "end":
                    facts.ended = True
                    facts.stage = event.stage
                    note_step_end(facts, event)
            elif event.what == DATALOADER_WORKERS_META:
                announced = event.workers
                if announced.__class__ is int and announced > 0:
                    facts.workers_expected += announced
            else:
                note_meta(facts, event)
        # until the step ends, a rank's stage is that of its latest event
        if not facts.ended and events and events[-1].stage:
            facts.stage = events[-1].stage

    @staticmethod
    def _fold_kwargs(fact: dict[str, Any], kwargs: Any, api: str, plan: FactPlan) -> None:
        """Keyword arguments reported on the post event (``Module.forward``: global
        pre-hooks never see them) count as the call's arguments; a pre-event argument of
        the same name wins."""
        keep = plan.keeps_args(api)
        if keep is False or not isinstance(kwargs, dict) or not kwargs:
            return
        args = fact.get("args")
        if not isinstance(args, dict):
            args = fact["args"] = {}
        for name, value in kwargs.items():
            if isinstance(name, str) and name not in args and (keep is None or name in keep):
                args[name] = value

    @staticmethod
    def _find_call(calls: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
        for fact in reversed(calls):
            if fact["key"] == key:
                return fact
        return None

    @staticmethod
    def _call_fact(event: Any, api: str, key: str, seq: int, index: int, plan: FactPlan) -> dict[str, Any]:
        parent = event.parent
        phase = event.phase
        fact: dict[str, Any] = {
            "api": api,
            "key": key,
            "parent": None if parent is None else f"{event.pid}:{parent}",
            "stage": event.stage,
            "o": [seq, index],
            "done": phase != "pre",
        }
        # optional fields of the wrong type are "unknown", like missing ones
        if event.module.__class__ is str:
            fact["module"] = event.module
        if event.mtype.__class__ is str:
            fact["mtype"] = event.mtype
        if event.training.__class__ is bool:
            fact["training"] = event.training
        if event.obj.__class__ is str:
            fact["obj"] = event.obj
        clears = event.clears
        if clears.__class__ is list and all(c.__class__ is str for c in clears):
            fact["clears"] = clears
        if event.trained.__class__ is bool:
            fact["trained"] = event.trained
        if event.cleared.__class__ is bool:
            fact["cleared"] = event.cleared
        if event.learned.__class__ is bool:
            fact["learned"] = event.learned
        if event.backprop.__class__ is bool:
            fact["backprop"] = event.backprop
        if event.fed.__class__ is bool:
            fact["fed"] = event.fed
        ctx = payload(event.ctx)
        if ctx.__class__ is dict:
            fact["ctx"] = ctx
        keep = plan.keeps_args(api)
        if keep is not False and event.args is not None:
            args = payload(event.args)
            if args.__class__ is dict:
                fact["args"] = args if keep is None else {k: v for k, v in args.items() if k in keep}
        if phase == "exc":
            fact["exc"] = True
        elif phase == "post" and event.ret is not UNSET:
            fact["ret"] = payload(event.ret)
        return fact

    # ------------------------------------------------------------------ queries
    def ended_ranks(self) -> int:
        return sum(1 for facts in self.ranks.values() if facts.ended)

    def missing_count(self) -> int:
        """Ranks of the declared world that have not ended the step (ranks are < world)."""
        return self.world - self.ended_ranks()

    def missing_ranks(self, limit: int = LISTED_RANKS) -> list[int]:
        """The lowest ``limit`` missing ranks: the walk stops after them, so its cost
        follows the ranks that reported, never the declared world size."""
        missing: list[int] = []
        for rank in range(self.world):
            if len(missing) >= limit:
                break
            facts = self.ranks.get(rank)
            if facts is None or not facts.ended:
                missing.append(rank)
        return missing

    def missing_workers(self) -> int:
        """Announced DataLoader workers of this step that have not reported yet."""
        return sum(max(0, facts.workers_expected - len(facts.worker_pids)) for facts in self.ranks.values())

    def is_complete(self) -> bool:
        return self.world > 0 and not self.missing_count() and not self.missing_workers()

    def stage(self) -> str:
        """The window's stage: the most common stage among the ranks that reported."""
        counts: dict[str, int] = {}
        for facts in self.ranks.values():
            if facts.stage:
                counts[facts.stage] = counts.get(facts.stage, 0) + 1
        if not counts:
            return ""
        return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]

    # ------------------------------------------------------------------ bytes
    def to_bytes(self) -> bytes:
        return msgpack.packb(
            [self.run, self.step, self.world, self.batches, self.events,
             {rank: facts.to_map() for rank, facts in self.ranks.items()}],
            use_bin_type=True, datetime=True,  # a decoded msgpack timestamp is a datetime
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> "WindowState":
        run, step, world, batches, events, ranks = msgpack.unpackb(data, raw=False, strict_map_key=False, timestamp=3)
        state = cls(run, step, world)
        state.batches = batches
        state.events = events
        state.ranks = {int(r): RankFacts.from_map(facts) for r, facts in ranks.items()}
        return state


def sorted_calls(facts: RankFacts) -> list[dict[str, Any]]:
    """A rank's calls in emission order, whatever order its batches arrived in."""
    return sorted(facts.calls, key=lambda c: (c["o"][0], c["o"][1]))
