"""Consistent: two variable attributes hold equal values.

Two forms, both evaluated inside one step window (no liveness-overlap guessing):

``scope = "ranks"``      the same variable on every data-parallel rank, e.g.
    ``{"scope": "ranks", "at": "post:torch.optim.Optimizer.step", "attr": "data_digest"}``
    — "after the optimizer step every rank holds bit-identical weights".  Broken by a
    module called outside its DDP wrapper, a skipped all-reduce, rank-local RNG.
    Variables their framework marks as shards or experts (``parallel`` attributes
    ``tensor_model_parallel = True``, ``allreduce = False``, ``expert``/``moe``) are
    never compared; unmarked ones that differ from step 0 on are found by
    `baselines.replication_baseline`.
``scope = "variables"``  two different variables on one rank, e.g. tied embeddings
    ``{"scope": "variables", "at": "step_end", "attr": "data_digest",
    "a": "module.lm_head.weight", "b": "module.tok_emb.weight"}``.

``scope = "aliases"``    every tie the producer reported in the run's first step (a
    snapshot with ``alias_of``: one tensor registered under two names) still holds,
    whatever the variables are called: ``{"scope": "aliases", "at": "step_end", "attr":
    "data_digest"}``.  The ties are a run-level baseline (`baselines.tie_baseline`,
    kept in `RunState.ties`) because a broken tie is no longer reported as one: after a
    checkpoint restore with ``assign=True`` the two names are independent tensors that
    drift apart.  Unlike ``variables`` it transfers to pipelines with other names.

Digests are full-tensor (every element counts), so equality is exact.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping

from ..window import FactPlan
from .base import Lazy, Mode, Site, Template
from .view import WindowView, freeze
from .baselines import BEFORE_FIRST_UPDATE, RANK_ATTRS, latest_by_name

TIED_ATTRS = ("data_digest",)
#: A digest shared by more variables than this is an initial constant (zeros/ones), not a tie.
MAX_TIE_GROUP = 4


def _point_attrs(at: str, wants: Callable[[tuple], bool]) -> tuple[list[str], list[str], list[str]]:
    """The attributes judged at snapshot point ``at`` by the ``ranks``, ``variables``
    and ``aliases`` scopes, of the families ``wants`` accepts."""
    def wanted(scope: str, attrs: tuple[str, ...]) -> list[str]:
        return [a for a in attrs if wants((scope, at, a))]

    return wanted("ranks", RANK_ATTRS), wanted("variables", TIED_ATTRS), wanted("aliases", TIED_ATTRS)


def _differing_attrs(reference: Mapping[str, dict], others: list[Mapping[str, dict]], wanted: list[str]) -> list[str]:
    """The attributes in ``wanted`` whose value differs from ``reference`` for some
    variable on some other rank (all mappings hold the same names).  Replicas usually
    hold equal snapshots, which one dict comparison settles per variable."""
    differing: set[str] = set()
    for other in others:
        for name in [n for n, ref_attrs in reference.items() if other[n] != ref_attrs]:
            attrs, ref_attrs = other[name], reference[name]
            for attr in wanted:
                mine, theirs = attrs.get(attr), ref_attrs.get(attr)
                if mine is not theirs and not mine == theirs:
                    differing.add(attr)
            if len(differing) == len(wanted):
                return wanted
    return [a for a in wanted if a in differing]


def _odd_ranks(holders: list[int], frozen: dict[int, Any]) -> list[int]:
    """Ranks outside the majority value; all holders when there is no majority."""
    counts: dict[Any, int] = {}
    for v in frozen.values():
        counts[v] = counts.get(v, 0) + 1
    if len(counts) == len(holders):  # every value is different: no majority
        return holders
    majority = max(counts.items(), key=lambda kv: (kv[1], repr(kv[0])))[0]
    return [r for r in holders if frozen[r] != majority] if counts[majority] > 1 else holders


def _drift_evidence(snapshots: dict[int, dict[str, dict]], name: str, attr: str, values: dict[int, Any],
                    holders: list[int]) -> dict[str, Any]:
    evidence = {"variable": name, "attr": attr, "values_by_rank": {str(r): values[r] for r in holders}}
    # digests say *that* replicas differ; norms hint at how much
    norm_name = "grad_norm" if attr == "grad_digest" else "data_norm"
    norms = {str(r): snapshots[r][name].get(norm_name) for r in holders}
    if any(v is not None for v in norms.values()):
        evidence[f"{norm_name}_by_rank"] = norms
    return evidence


def _framework_sharded(attrs: Mapping[str, Any]) -> bool:
    """A variable its framework marks as a shard or expert (Megatron/DeepSpeed attributes
    captured by the producer as ``parallel``, and ``sharded`` for PyTorch's own DTensor
    and FSDP shards) is not a replica, even when it starts
    identical on every rank (a zero-initialised column-parallel bias)."""
    marks = attrs.get("parallel")
    if not isinstance(marks, dict):
        return False
    return (marks.get("tensor_model_parallel") is True or marks.get("sharded") is True or marks.get("allreduce") is False
            or bool(marks.get("expert")) or bool(marks.get("moe")))


class Consistent(Template):
    relation = "Consistent"

    def is_value_family(self, family: tuple) -> bool:
        return family[0] == "variables"

    def check_plan(self, families: Any) -> dict[str, tuple[list[str], list[str], list[str]]]:
        """Snapshot point -> the attributes its ``ranks``, ``variables`` and ``aliases``
        families are about (points no family names are left out)."""
        return {f[1]: _point_attrs(f[1], families.__contains__) for f in families}

    def sites(self, view: WindowView, mode: Mode) -> Iterator[Site]:
        checking, plan = mode.checking, mode.plan
        ranks = view.ranks()
        points: set[str] = set()
        for rank in ranks:
            points.update(view.facts(rank).states)
        for at in sorted(points):
            if not checking:
                rank_attrs, tie_attrs, alias_attrs = _point_attrs(at, mode.wants)
            elif at in plan:  # the points no deployed family names are skipped unread
                rank_attrs, tie_attrs, alias_attrs = plan[at]
            else:
                continue
            snapshots = {rank: latest_by_name(view.facts(rank), at) for rank in ranks}
            if rank_attrs:
                yield from self._rank_sites(view, at, snapshots, checking, rank_attrs)
            if tie_attrs:
                yield from self._tie_sites(view, at, snapshots, tie_attrs)
            if alias_attrs:
                yield from self._alias_sites(view, at, snapshots, checking, alias_attrs)

    def _rank_sites(self, view: WindowView, at: str, snapshots: dict[int, dict[str, dict]], checking: bool,
                    wanted: list[str]) -> Iterator[Site]:
        present = [r for r, names in snapshots.items() if names]
        if len(present) < 2:
            return
        # rank-local variables (expert/tensor-parallel shards) are not replicas
        local = {a: set(view.rank_local.get(a, ())) for a in wanted}
        has_local = any(local.values())
        if checking and not has_local:
            # most steps agree everywhere; compare whole columns first
            reference = snapshots[present[0]]
            if all(snapshots[r].keys() == reference.keys() for r in present[1:]):
                wanted = _differing_attrs(reference, [snapshots[r] for r in present[1:]], wanted)
                if not wanted:
                    return
        names = sorted(set().union(*(snapshots[r].keys() for r in present)))
        for name in names:
            holders = [r for r in present if name in snapshots[r]]
            if len(holders) < 2:
                continue
            if any(_framework_sharded(snapshots[r][name]) for r in holders):
                continue
            if not checking:
                records: Any = Lazy(lambda name=name, holders=holders: [view.state_record(snapshots[r][name], r)
                                                                          for r in holders])
            else:
                records = [view.snapshot_record(snapshots[r][name], r) for r in holders]
            for attr in wanted:
                if has_local and name in local[attr]:
                    continue
                values = {r: snapshots[r][name].get(attr) for r in holders}
                first = values[holders[0]]
                if all(v == first for v in values.values()):
                    if first is None:
                        continue
                    if checking:
                        continue
                    holds = True
                else:
                    frozen = {r: freeze(v) for r, v in values.items()}
                    holds = len(set(frozen.values())) == 1
                if holds:
                    yield Site(("ranks", at, attr), True, records, holders,
                               snapshots[holders[0]][name].get("stage", ""), {})
                    continue
                yield Site(  # positional: drifted replicas fail at every variable
                    ("ranks", at, attr),
                    False,
                    records,
                    _odd_ranks(holders, frozen),
                    snapshots[holders[0]][name].get("stage", ""),
                    lambda name=name, attr=attr, values=values, holders=holders: _drift_evidence(
                        snapshots, name, attr, values, holders),
                )

    def _tie_sites(self, view: WindowView, at: str, snapshots: dict[int, dict[str, dict]],
                   attrs: list[str]) -> Iterator[Site]:
        for attr in attrs:
            family = ("variables", at, attr)
            for rank, names in sorted(snapshots.items()):
                if not names:
                    continue
                groups: dict[Any, list[str]] = {}
                for name, attrs in names.items():
                    value = attrs.get(attr)
                    numel = attrs.get("numel")
                    if value is None or (isinstance(numel, int) and numel <= 1):
                        continue
                    groups.setdefault(value if isinstance(value, str) else freeze(value), []).append(name)
                pairs = set()
                for members in groups.values():
                    if 1 < len(members) <= MAX_TIE_GROUP:
                        members.sort()
                        for i, a in enumerate(members):
                            for b in members[i + 1 :]:
                                pairs.add((a, b))
                yield Site(
                    family=family,
                    observed=frozenset(pairs),
                    records=[view.window_record(rank)],
                    ranks=[rank],
                    stage=view.rank_stage(rank),
                    context=names,
                )

    def _alias_sites(self, view: WindowView, at: str, snapshots: dict[int, dict[str, dict]], checking: bool,
                     attrs: list[str]) -> Iterator[Site]:
        for attr in attrs:
            family = ("aliases", at, attr)
            run_ties = {tuple(pair) for pair in view.ties}
            for rank, names in sorted(snapshots.items()):
                pairs = set(run_ties)
                # ties of this window too (runs tied after step 0)
                for name, primary in [(n, attrs["alias_of"]) for n, attrs in names.items() if "alias_of" in attrs]:
                    if isinstance(primary, str) and primary and primary != name:
                        pairs.add((name, primary))
                judged = [(a, b) for a, b in sorted(pairs)
                          if names.get(a, {}).get(attr) is not None and names.get(b, {}).get(attr) is not None]
                if not judged:
                    continue
                broken = [(a, b) for a, b in judged if names[a][attr] != names[b][attr]]
                if not broken and checking:
                    continue
                yield Site(
                    family=family,
                    observed=not broken,
                    # a tie binds in every stage and context: no precondition worth learning
                    records=[{"rank": rank}],
                    ranks=[rank],
                    stage=view.rank_stage(rank),
                    evidence={} if not broken else {
                        "broken": [{"alias": a, "of": b, "alias_value": names[a][attr], "value": names[b][attr],
                                    "still_reported_as_alias": names[a].get("alias_of") == b} for a, b in broken[:4]],
                        "attr": attr,
                    },
                )

    def params(self, family: tuple, value: Any) -> dict[str, Any]:
        if family[0] in ("ranks", "aliases"):
            return {"scope": family[0], "at": family[1], "attr": family[2]}
        return {"scope": "variables", "at": family[1], "attr": family[2], "a": value[0], "b": value[1]}

    def key(self, params: Mapping[str, Any]) -> tuple[tuple, Any]:
        scope = params["scope"]
        if scope in ("ranks", "aliases"):
            if scope == "aliases" and params["attr"] not in TIED_ATTRS:
                raise ValueError("attr")
            return (scope, str(params["at"]), str(params["attr"])), None
        if scope == "variables":
            return ("variables", str(params["at"]), str(params["attr"])), (str(params["a"]), str(params["b"]))
        raise ValueError("scope")

    def needs(self, params: Mapping[str, Any]) -> FactPlan:
        norm = "grad_norm" if params["attr"] == "grad_digest" else "data_norm"
        if params["scope"] == "aliases":
            return FactPlan(apis=set(), state_points={params["at"]}, state_attrs={params["attr"], "alias_of"})
        if params["scope"] == "ranks" and params["attr"] == "data_digest":
            # variables that differ before their first update are rank-local by
            # construction (`baselines.replication_baseline`)
            return FactPlan(apis=set(), state_points={params["at"], BEFORE_FIRST_UPDATE},
                            state_attrs={"data_digest", "numel", norm, "parallel"})
        return FactPlan(apis=set(), state_points={params["at"]}, state_attrs={params["attr"], "numel", norm, "parallel"})

    def apis(self, params: Mapping[str, Any]) -> list[str]:
        at = str(params.get("at", ""))
        return [at.split(":", 1)[1]] if ":" in at else []

    def describe(self, params: Mapping[str, Any]) -> str:
        where = _where(params["at"])
        if params["scope"] == "ranks":
            return f"every parameter's {params['attr']} is identical on all data-parallel ranks {where}"
        if params["scope"] == "aliases":
            return (f"variables tied at the start of the run (one tensor under two names) keep identical "
                    f"{params['attr']} {where}")
        return f"{params['a']} and {params['b']} hold identical {params['attr']} {where} (tied variables)"

    def hint(self, params: Mapping[str, Any]) -> str:
        if params["scope"] == "ranks":
            return (
                "replicas have drifted apart: a gradient all-reduce was skipped (module called outside "
                "its DDP wrapper, no_sync left on, a rank-local condition), rank-local randomness, or data "
                "corrupted in transfer"
            )
        return "the tie between the two variables was broken (one was re-created, copied or loaded separately)"

    def applicable(self, value: Any, site: Site) -> bool:
        names = site.context or {}
        return value[0] in names and value[1] in names

    def violation_evidence(self, params: Mapping[str, Any], site: Site) -> dict[str, Any]:
        if params["scope"] in ("ranks", "aliases"):
            return site.get_evidence()
        names = site.context or {}
        attr = params["attr"]
        return {"a": params["a"], "b": params["b"], "attr": attr,
                "a_value": names.get(params["a"], {}).get(attr), "b_value": names.get(params["b"], {}).get(attr)}


def _where(at: str) -> str:
    if at == "step_end":
        return "at the end of each step"
    when, _, api = at.partition(":")
    return f"{'before' if when == 'pre' else 'after'} {api}" if api else f"at {at}"
