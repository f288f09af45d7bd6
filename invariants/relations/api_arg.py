"""APIArg: an argument is consistent across ranks, or distinct across calls.

``form = "ranks"``     the i-th call of an API in a step has the same argument on
    every rank: ``{"form": "ranks", "api": "torch.distributed.all_reduce", "arg": "op"}``,
    also tensor summaries (a collective's shape), dropout ``p``, learning rates.
    Broken by ranks that disagree on a collective (hangs, wrong sums) or hyperparameters.
    Calls of a rank that trains a separate model (``ctx.separate``: pipeline stages,
    federated clients) are compared only on collectives.
    A tensor is compared by what the call is about (shape, dtype, device), never by the
    scalar value its summary may carry: that is each rank's own data (a local loss, the
    receive buffer of a ``broadcast`` before it is filled).
``form = "distinct"``  repeated calls of an API within one step and rank never repeat
    an argument value: ``{"form": "distinct", "api": "torch.utils.data.worker_init",
    "arg": "numpy_state_digest"}`` — every DataLoader worker starts from its own RNG
    state.  Broken by workers that all apply the same "random" augmentation.
    Distinct rules take no precondition: one repeated value in the references drops them.
    Only RNG-like values (seeds, RNG-state digests: `names_rng_value`) are learnt as
    distinct: a tensor or an id never passed twice by the references is a habit, not a
    law ("``all_reduce`` never reduces the same tensor twice in a step" is false of a
    healthy hand-written data-parallel loop).
    A ``None`` argument is "not applicable" and never counts as a repeat: the DataLoader
    worker start reports ``dataset_rng_digest = None`` for datasets that own no RNG, and
    ``{"form": "distinct", "api": "torch.utils.data.worker_init", "arg":
    "dataset_rng_digest"}`` then judges only pipelines whose dataset keeps its own
    generator (copied unchanged into every worker unless a ``worker_init_fn`` reseeds it).
``form = "apart"``     the i-th call of an API in a step has a different argument on
    every rank: ``{"form": "apart", "api": "torch.optim.Optimizer.step", "arg":
    "batch_digest"}`` — data-parallel replicas train on batches of their own
    (`producers.replica_batches`).  Broken by ranks that all draw the same batches (a
    sampler that does not split the data by rank).  Only digests of data are learnt
    apart (`names_data_digest`), and they are never learnt as agreeing across ranks.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from ..window import FactPlan
from .base import Mode, Site, Template
from .view import WindowView, freeze

#: words of argument names whose values come from an RNG (seeds, RNG-state digests)
RNG_WORDS = ("seed", "rng", "random", "generator", "state_digest")


def across_ranks(value: Any) -> Any:
    """What of an argument must agree across ranks: a tensor summary without its value."""
    if isinstance(value, dict) and value.get("T") == "tensor" and "value" in value:
        return {key: item for key, item in value.items() if key != "value"}
    return value


def names_data_digest(arg: Any) -> bool:
    """Whether an argument is a digest of the data a rank trained on."""
    return str(arg).endswith("batch_digest")


def names_rng_value(arg: Any) -> bool:
    """Whether an argument's name says its value is drawn from an RNG."""
    lowered = str(arg).lower()
    return any(word in lowered for word in RNG_WORDS)


COLLECTIVE_PREFIX = "torch.distributed."


def _separate(call: dict[str, Any]) -> bool:
    """A call of a rank that trains a separate model (`producers.replicas`): its
    arguments are that model's own, never compared across ranks."""
    ctx = call.get("ctx")
    return isinstance(ctx, dict) and ctx.get("separate") is True


def _by_pass(calls: list[dict[str, Any]]) -> dict[tuple[str, Any], list[dict[str, Any]]]:
    """A rank's calls by the kind of pass that made them (stage, gradients on or off).

    Ranks are compared call by call within the same kind of pass: work that only some
    ranks do (rank 0 evaluating or logging without gradients between two iterations)
    must not shift the calls every rank makes."""
    grouped: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    for call in calls:
        ctx = call.get("ctx")
        grouped.setdefault((call.get("stage", ""), ctx.get("grad") if isinstance(ctx, dict) else None), []).append(call)
    return grouped


class APIArg(Template):
    relation = "APIArg"

    def allows_precondition(self, family: tuple) -> bool:
        return family[0] == "ranks"

    def keeps_hypothesis(self, params: Mapping[str, Any]) -> bool:
        # "never repeats" is a law only for values drawn from an RNG; that a tensor or
        # an id was never passed twice in the references is one program's habit
        # and data digests are judged only as differing across ranks
        form, arg = params["form"], params["arg"]
        if form == "distinct":
            return names_rng_value(arg)
        return (form == "apart") == names_data_digest(arg)

    def check_plan(self, families: Any) -> tuple[dict[tuple[str, str], list[str]], frozenset[str]]:
        """(form, api) -> the sorted argument names its families are about, and the APIs."""
        wanted: dict[tuple[str, str], list[str]] = {}
        for form, api, name in sorted(families):
            wanted.setdefault((form, api), []).append(name)
        return wanted, frozenset(api for _, api in wanted)

    def sites(self, view: WindowView, mode: Mode) -> Iterator[Site]:
        ranks = view.ranks()
        wanted, wanted_apis = mode.plan if mode.checking else (None, None)
        per_rank: dict[int, dict[str, list[dict[str, Any]]]] = {}
        for rank in ranks:
            grouped: dict[str, list[dict[str, Any]]] = {}
            if wanted is None:
                for call in view.calls(rank):
                    if "args" in call and call["args"]:
                        grouped.setdefault(call["api"], []).append(call)
            else:  # checking: only the APIs some deployed rule is about
                by_api = view.calls_by_api(rank)
                for api in wanted_apis:
                    with_args = [call for call in by_api.get(api, ()) if "args" in call and call["args"]]
                    if with_args:
                        grouped[api] = with_args
            per_rank[rank] = grouped
        apis = sorted(set().union(*(g.keys() for g in per_rank.values()))) if per_rank else []
        for api in apis:
            aligned = None if wanted is None else [*wanted.get(("ranks", api), ()), *wanted.get(("apart", api), ())]
            if aligned is None or aligned:
                yield from self._rank_sites(view, api, per_rank, mode, aligned)
            if wanted is None or ("distinct", api) in wanted:
                yield from self._distinct_sites(view, api, per_rank, mode,
                                                None if wanted is None else wanted[("distinct", api)])

    def _rank_sites(self, view: WindowView, api: str, per_rank: dict, mode: Mode,
                    wanted_names: list[str] | None) -> Iterator[Site]:
        """``wanted_names``: the sorted argument names deployed rules are about (checking)."""
        if not api.startswith(COLLECTIVE_PREFIX):  # a collective's arguments agree whatever the model
            per_rank = {r: {api: kept} for r, grouped in per_rank.items() if api in grouped
                        for kept in [[call for call in grouped[api] if not _separate(call)]] if kept}
        holders = [r for r in sorted(per_rank) if api in per_rank[r]]
        if len(holders) < 2:
            return
        by_pass = {r: _by_pass(per_rank[r][api]) for r in holders}
        for key in sorted(set().union(*by_pass.values()), key=repr):
            sharing = [r for r in holders if key in by_pass[r]]
            if len(sharing) >= 2:
                yield from self._aligned_sites(view, {r: by_pass[r][key] for r in sharing}, api, mode,
                                               wanted_names)

    def _aligned_sites(self, view: WindowView, calls_by_rank: dict[int, list[dict[str, Any]]], api: str,
                       mode: Mode, wanted_names: list[str] | None) -> Iterator[Site]:
        """The i-th calls of one kind of pass, compared across the ranks that made them."""
        checking, families = mode.checking, mode.families
        holders = sorted(calls_by_rank)
        occurrences = min(len(found) for found in calls_by_rank.values())
        for index in range(occurrences):
            calls = {r: calls_by_rank[r][index] for r in holders}
            if wanted_names is None:
                names = sorted(set.intersection(*(set(c["args"]) for c in calls.values())))
            else:
                names = [n for n in wanted_names if all(n in c["args"] for c in calls.values())]
            for name in names:
                if names_data_digest(name):
                    yield from self._apart_sites(view, calls, api, name, index, mode)
                    continue
                family = ("ranks", api, name)
                if checking and family not in families:
                    continue
                first = across_ranks(calls[holders[0]]["args"][name])
                holds = all(across_ranks(c["args"][name]) == first for c in calls.values())
                if holds and checking:
                    continue
                odd = holders
                evidence: dict[str, Any] = {}
                if not holds:
                    values = {r: freeze(across_ranks(c["args"][name])) for r, c in calls.items()}
                    counts: dict[Any, int] = {}
                    for v in values.values():
                        counts[v] = counts.get(v, 0) + 1
                    top, n = max(counts.items(), key=lambda kv: (kv[1], repr(kv[0])))
                    odd = [r for r in holders if values[r] != top] if n > 1 else holders
                    evidence = {"call_index": index, "arg": name,
                                "values_by_rank": {str(r): c["args"][name] for r, c in calls.items()}}
                yield Site(
                    family=family,
                    observed=holds,
                    records=lambda calls=calls: [view.call_record(c, r) for r, c in calls.items()],
                    ranks=odd,
                    stage=calls[holders[0]].get("stage", ""),
                    evidence=evidence,
                )

    def _apart_sites(self, view: WindowView, calls: dict[int, dict[str, Any]], api: str, name: str,
                     index: int, mode: Mode) -> Iterator[Site]:
        """The i-th calls of one kind of pass: no two ranks passed the same value.  A
        ``None`` is "not applicable" (a step that drew no batch of its own)."""
        family = ("apart", api, name)
        if mode.checking and family not in mode.families:
            return
        valued = {r: c for r, c in calls.items() if c["args"].get(name) is not None}
        if len(valued) < 2:
            return
        ranks_by_value: dict[Any, list[int]] = {}
        for rank, call in valued.items():
            ranks_by_value.setdefault(freeze(call["args"][name]), []).append(rank)
        shared = sorted(r for ranks in ranks_by_value.values() if len(ranks) > 1 for r in ranks)
        if not shared and mode.checking:
            return
        first = valued[min(valued)]
        yield Site(
            family=family,
            observed=not shared,
            records=lambda valued=valued: [view.call_record(c, r) for r, c in valued.items()],
            ranks=shared,
            stage=first.get("stage", ""),
            evidence={"call_index": index, "arg": name, "ranks_with_the_same_value": shared} if shared else {},
        )

    def _distinct_sites(self, view: WindowView, api: str, per_rank: dict, mode: Mode,
                        wanted_names: list[str] | None) -> Iterator[Site]:
        checking, families = mode.checking, mode.families
        for rank in sorted(per_rank):
            all_calls = per_rank[rank].get(api) or []
            if len(all_calls) < 2:
                continue
            if wanted_names is None:
                names = sorted(set.union(*(set(c["args"]) for c in all_calls)))
            else:
                names = [n for n in wanted_names if any(n in c["args"] for c in all_calls)]
            for name in names:
                family = ("distinct", api, name)
                if checking and family not in families:
                    continue
                # None is "not applicable here" (a dataset that owns no RNG), never a value
                calls = [c for c in all_calls if c["args"].get(name) is not None]
                if len(calls) < 2:
                    continue
                values = [freeze(c["args"][name]) for c in calls]
                holds = len(set(values)) == len(values)
                if holds and checking:
                    continue
                evidence = {}
                if not holds:
                    seen: dict[Any, int] = {}
                    repeated = []
                    for v, c in zip(values, calls):
                        seen[v] = seen.get(v, 0) + 1
                        if seen[v] == 2:
                            repeated.append(c["args"][name])
                    evidence = {"arg": name, "calls": len(calls), "repeated_values": repeated[:5]}
                yield Site(
                    family=family,
                    observed=holds,
                    records=lambda calls=calls, rank=rank: [view.call_record(calls[0], rank)],
                    ranks=[rank],
                    stage=calls[0].get("stage", ""),
                    evidence=evidence,
                )

    def params(self, family: tuple, value: Any) -> dict[str, Any]:
        return {"form": family[0], "api": family[1], "arg": family[2]}

    def key(self, params: Mapping[str, Any]) -> tuple[tuple, Any]:
        if params["form"] not in ("ranks", "distinct", "apart"):
            raise ValueError("form")
        return (params["form"], str(params["api"]), str(params["arg"])), None

    def needs(self, params: Mapping[str, Any]) -> FactPlan:
        return FactPlan(apis={params["api"]}, args={params["api"]: {params["arg"]}}, state_points=set(), state_attrs=set())

    def describe(self, params: Mapping[str, Any]) -> str:
        if params["form"] == "ranks":
            return f"argument {params['arg']!r} of {params['api']} is the same on every rank for the same call"
        if params["form"] == "apart":
            return f"argument {params['arg']!r} of {params['api']} differs between any two ranks for the same call"
        return f"argument {params['arg']!r} of {params['api']} never repeats across calls within a step"

    def hint(self, params: Mapping[str, Any]) -> str:
        if params["form"] == "ranks":
            return ("ranks disagree on this call: rank-dependent configuration, uneven data/shapes, or a collective "
                    "issued with different arguments (can hang or silently corrupt the reduction)")
        if params["form"] == "apart":
            return ("ranks trained on the same batches: the sampler does not split the data by rank (a plain or "
                    "weighted random sampler seeded alike on every rank instead of a DistributedSampler, or an "
                    "iterable dataset that ignores the rank), so the replicas average copies of one gradient")
        return ("values that should differ are repeated: RNG state copied into every worker/call "
                "(e.g. numpy seeded once before forking DataLoader workers), or an init re-run with the same seed")
