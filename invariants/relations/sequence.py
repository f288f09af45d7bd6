"""APISequence: one top-level call precedes another inside every step window.

``{"first": "torch.optim.Optimizer.zero_grad", "then": "torch.optim.Optimizer.step"}``
— "in every step where the optimizer steps, gradients were zeroed before it".  Broken
by a dropped ``zero_grad()`` (gradients silently accumulate across steps).

Ordering rules are the noisiest template, so this one is pruned hard:
* only calls made directly by user code (no recorded parent) take part, so
  caller/callee pairs and library internals never become rules;
* only APIs called at most ``MAX_CALLS_PER_WINDOW`` times per rank and step;
* the later call must be a training-loop call: present in at least half the steps
  of every reference run that makes it (``model.train()`` after a periodic validation
  pass is not one);
* step 0 is not an example: its order is that of model construction and setup,
  which differs between pipelines and breaks when a layer is built mid-run;
* a learned rule may be scoped only by stage (hand-written ones may also use
  ``step_is_first``), and must hold in every window of every reference trace.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from ..window import FactPlan
from .base import Site, Template, WindowView

MAX_CALLS_PER_WINDOW = 4


class APISequence(Template):
    relation = "APISequence"
    min_support = 3
    #: "X before Y, but only at the first step" describes one window per run: noise
    inference_fields = frozenset({"stage"})
    #: ordering rules only about training-loop calls: Y must be called in at least half
    #: the steps of every reference run that calls it (not a validation-time toggle)
    min_window_fraction = 0.5

    def is_value_family(self, family: tuple) -> bool:
        return True

    def allows_precondition(self, family: tuple) -> bool:
        return True  # records carry only stage/step_is_first, so that is all a rule can say

    def sites(self, view: WindowView, families: Any = None, plan: Any = None) -> Iterator[Site]:
        if view.step == 0:
            return  # setup (model construction, seeding, init) is not a training-loop ordering
        for rank in view.ranks():
            first_seen: dict[str, int] = {}
            counts: dict[str, int] = {}
            # calls made directly by user code; the rest are most of a step's calls
            top_level = [(index, call["api"]) for index, call in enumerate(view.calls(rank)) if call.get("parent") is None]
            for index, api in top_level:
                counts[api] = counts.get(api, 0) + 1
                first_seen.setdefault(api, index)
            eligible = {api for api, n in counts.items() if n <= MAX_CALLS_PER_WINDOW}
            record = None
            for then in sorted(eligible):
                family = ("seq", then)
                if families is not None and family not in families:
                    continue
                at = first_seen[then]
                before = frozenset(api for api in eligible if first_seen[api] < at)
                if record is None:
                    record = {"stage": view.rank_stage(rank), "step_is_first": view.step == 0}
                yield Site(
                    family=family,
                    observed=before,
                    records=[record],
                    ranks=[rank],
                    stage=view.rank_stage(rank),
                    evidence=lambda before=before, then=then: {"calls_before": sorted(before), "then": then},
                )

    def params(self, family: tuple, value: Any) -> dict[str, Any]:
        return {"first": value, "then": family[1]}

    def key(self, params: Mapping[str, Any]) -> tuple[tuple, Any]:
        return ("seq", str(params["then"])), str(params["first"])

    def needs(self, params: Mapping[str, Any]) -> FactPlan:
        return FactPlan(apis={params["first"], params["then"]}, args={}, state_points=set(), state_attrs=set())

    def describe(self, params: Mapping[str, Any]) -> str:
        return f"in every step that calls {params['then']}, {params['first']} is called before it"

    def hint(self, params: Mapping[str, Any]) -> str:
        return (f"{params['first']} was skipped or moved after {params['then']} in this step "
                "(a refactored training loop, an early `continue`, a misplaced call)")

    def violation_evidence(self, params: Mapping[str, Any], site: Site) -> dict[str, Any]:
        return dict(site.get_evidence(), missing_before=params["first"])
