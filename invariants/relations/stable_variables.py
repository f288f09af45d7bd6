"""StableVariables: the set of tracked variables does not change size mid-run.

``{"at": "post:torch.optim.Optimizer.step"}`` — "every step snapshots as many
parameters after the optimizer step as step 0 did".  A parameter added, replaced or
dropped mid-run is a classic silent error: a checkpoint restored with ``assign=True``
turns a tied pair into two independent tensors, an optimizer is rebuilt over a
different module, a model is re-instantiated while the old optimizer keeps stepping.

The count at step 0 (per rank and snapshot point) is the run-level baseline, kept in
`RunState.variable_counts` like the rank-local baseline; the count rather than the
names is compared because names of parameters the producer could not map back to a
module are synthetic (``opt1.g0.p0``).  The evidence lists the names seen.  No
precondition: one reference run whose count changes drops the rule.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from ..rank_facts import RankFacts
from ..window import FactPlan
from .base import Mode, Site, Template

from .view import WindowView
MAX_NAMES_IN_EVIDENCE = 12


def snapshot_names(facts: RankFacts, at: str) -> set[str]:
    names: set[str] = set()
    for per_call in (facts.states.get(at) or {}).values():
        names.update(per_call)
    return names


def variable_counts(window: Any) -> dict[str, dict[int, int]]:
    """Baseline of a run: at -> rank -> number of variables, from its step-0 window."""
    counts: dict[str, dict[int, int]] = {}
    for rank, facts in window.ranks.items():
        for at in facts.states:
            counts.setdefault(at, {})[int(rank)] = len(snapshot_names(facts, at))
    return counts


class StableVariables(Template):
    relation = "StableVariables"
    min_support = 3

    def allows_precondition(self, family: tuple) -> bool:
        return False

    def sites(self, view: WindowView, mode: Mode) -> Iterator[Site]:
        if view.step == 0 or not view.variable_counts:
            return
        checking = mode.checking
        for rank in view.ranks():
            facts = view.facts(rank)
            for at in sorted(facts.states):
                family = ("count", at)
                if not mode.wants(family):
                    continue
                baseline = view.variable_counts.get(at, {}).get(rank)
                if baseline is None:
                    continue
                names = snapshot_names(facts, at)
                holds = len(names) == baseline
                if holds and checking:
                    continue
                yield Site(
                    family=family,
                    observed=holds,
                    records=lambda rank=rank: [view.window_record(rank)],
                    ranks=[rank],
                    stage=view.rank_stage(rank),
                    evidence={} if holds else {
                        "at": at, "count_at_step_0": baseline, "count": len(names),
                        "names": sorted(names)[:MAX_NAMES_IN_EVIDENCE],
                    },
                )

    def params(self, family: tuple, value: Any) -> dict[str, Any]:
        return {"at": family[1]}

    def key(self, params: Mapping[str, Any]) -> tuple[tuple, Any]:
        return ("count", str(params["at"])), None

    def needs(self, params: Mapping[str, Any]) -> FactPlan:
        return FactPlan(apis=set(), state_points={params["at"]}, state_attrs=set())

    def apis(self, params: Mapping[str, Any]) -> list[str]:
        at = str(params.get("at", ""))
        return [at.split(":", 1)[1]] if ":" in at else []

    def describe(self, params: Mapping[str, Any]) -> str:
        at = params["at"]
        if at == "step_end":
            where = "at the end of each step"
        else:
            when, _, api = at.partition(":")
            where = f"{'before' if when == 'pre' else 'after'} {api}"
        return f"as many variables are tracked {where} as at step 0 (none added, replaced or dropped mid-run)"

    def hint(self, params: Mapping[str, Any]) -> str:
        return ("parameters were re-created or re-registered mid-run: a checkpoint loaded with assign=True "
                "(which also unties tied weights), an optimizer rebuilt over a different module, or a model "
                "re-instantiated while training continues")
