"""APISequence: one top-level call precedes another inside every step window.

``{"first": "torch.optim.Optimizer.zero_grad", "then": "torch.optim.Optimizer.step"}``
— "in every step where the optimizer steps, gradients were zeroed before it".  Broken
by a dropped ``zero_grad()`` (gradients silently accumulate across steps).

Ordering rules are the noisiest template, so this one is pruned hard:
* only calls made directly by user code (no recorded parent) take part, so
  caller/callee pairs and library internals never become rules;
* only APIs called at most ``MAX_CALLS_PER_WINDOW`` times per rank and step are
  learnt from (a pruning of inference, not part of a rule's meaning: checking "A before
  B" counts every earlier A, so an evaluation pass that runs many forwards in the same
  window does not hide the forward that came before B);
* the later call must be a training-loop call: present in at least half the steps
  of every reference run that makes it (``model.train()`` after a periodic validation
  pass is not one);
* per optimizer object: when calls carry receiver ids, "zero_grad before step" at
  optimizer ``opt1``'s step holds only by a clear of opt1's gradients
  (``Optimizer.zero_grad`` on opt1, or a ``Module.zero_grad`` whose ``clears`` holds
  opt1: equivalent operations are one fact, see `identity`); calls without ids match
  every optimizer, as in traces of older producers;
* a step whose call says no backward pass ever ran in its process (``backprop`` false:
  gradients computed with ``torch.func``/``autograd.grad`` and assigned, DP-SGD style)
  is not judged on a backward before it;
* a step whose call says a backward ran since its optimizer's previous step (``fed``)
  counts as preceded by a backward, even when the backward sits in the previous window
  (two critics back-propagated, then stepped one after the other);
* a step whose call says its optimizer was ``cleared`` since its previous step counts
  as preceded by that clear, even when it sits in the previous window (optimizers that
  each clear right after their own step: the window ends after the last one);
* step 0 is not an example: it is the setup window (model construction,
  initialisation, seeding), whose order differs between pipelines; nor is the first
  iteration of an optimizer (step 1, or a window where an optimizer steps for the first
  time: a second model trained later): a loop that clears gradients at the *end* of
  each iteration has no clear before its first backward, because no earlier iteration
  left any gradient;
* only orderings a gradient depends on are rules: a mode switch (``train()``/``eval()``)
  before a training call, or a clear before the forward, is one program's habit (one
  loop switches modes every iteration, another once per epoch; one clears before the
  forward, another after the step) and never a law;
* a learned rule may be scoped only by stage (hand-written ones may also use
  ``step_is_first``), and must hold in every window of every reference trace.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from ..events import (
    BACKWARD_APIS,
    GRAD_CLEAR_API,
    MODULE_EVAL,
    MODULE_FORWARD,
    MODULE_TRAIN,
    MODULE_ZERO_GRAD,
    OPTIMIZER_STEP,
    OPTIMIZER_ZERO_GRAD,
    TENSOR_BACKWARD,
)
from ..window import FactPlan
from .base import Mode, Site, Template
from .view import WindowView
from .identity import call_facts, same_objects

MAX_CALLS_PER_WINDOW = 4
MODE_SWITCHES = frozenset({MODULE_TRAIN, MODULE_EVAL})
#: step 0 is the setup window, step 1 the first training iteration
FIRST_ITERATION_STEP = 1


class APISequence(Template):
    relation = "APISequence"
    min_support = 3
    #: "X before Y, but only at the first step" describes one window per run: noise
    inference_fields = frozenset({"stage"})
    #: ordering rules only about training-loop calls: Y must be called in at least half
    #: the steps of every reference run that calls it (not a validation-time toggle)
    min_window_fraction = 0.5

    def keeps_hypothesis(self, params: Mapping[str, Any]) -> bool:
        first, then = params["first"], params["then"]
        if first in MODE_SWITCHES or first == GRAD_CLEAR_API:
            return False  # a clear by hand is a fact only as the zero_grad it is equivalent to
        return not (first in (OPTIMIZER_ZERO_GRAD, MODULE_ZERO_GRAD) and then == MODULE_FORWARD)

    def is_value_family(self, family: tuple) -> bool:
        return True

    def allows_precondition(self, family: tuple) -> bool:
        return True  # records carry only stage/step_is_first, so that is all a rule can say

    def windows_counted(self, view: WindowView) -> int:
        """A later window of an optimizer's first step is not judged, so it does not count:
        a program that builds a new optimizer at each resume would otherwise show its
        training-loop calls in too few windows."""
        if view.step <= FIRST_ITERATION_STEP:
            return len(view.ranks())
        return sum(1 for rank in view.ranks() if not _first_step(view, rank))

    def sites(self, view: WindowView, mode: Mode) -> Iterator[Site]:
        checking, families = mode.checking, mode.families
        if view.step <= FIRST_ITERATION_STEP:
            return  # setup, and the first iteration's clear of what no iteration left
        for rank in view.ranks():
            top_level = [call for call in view.calls(rank) if call.get("parent") is None]
            if _first_step(view, rank):
                continue  # an optimizer's first iteration: nothing before it left gradients
            # (api, optimizers) facts of the calls made directly by user code, in order;
            # the rest are most of a step's calls
            facts = [fact for call in top_level for fact in call_facts(call)]
            # a step of an optimizer cleared since its previous step (the clear may sit in
            # the previous window: two optimizers that each clear right after their own
            # step) has had its clear, wherever the window boundary fell
            carried = {fact for call in top_level if call["api"] == OPTIMIZER_STEP and call.get("cleared") is True
                       for fact in call_facts(call)}
            # a step no backward can have fed (none ran in its process), or one a backward
            # fed since its previous step (which may sit in the previous window)
            without_backprop = {fact for call in top_level
                                if call["api"] == OPTIMIZER_STEP
                                and (call.get("backprop") is False or call.get("fed") is True)
                                for fact in call_facts(call)}
            counts: dict[str, int] = {}
            for api, _ in facts:
                counts[api] = counts.get(api, 0) + 1
            eligible = {api for api, n in counts.items() if n <= MAX_CALLS_PER_WINDOW}
            # one site per API and optimizer: its first such call, and what preceded it
            # about the same optimizer (or about none)
            seen: set[tuple[str, frozenset[str] | None]] = set()
            record = None
            for index, (then, objects) in enumerate(facts):
                if then not in eligible or (then, objects) in seen:
                    continue
                seen.add((then, objects))
                family = ("seq", then)
                if checking and family not in families:
                    continue
                before = frozenset(api for api, earlier in facts[:index]
                                   if (checking or api in eligible) and api != then and same_objects(earlier, objects))
                if (then, objects) in carried:
                    before |= {OPTIMIZER_ZERO_GRAD}
                if (then, objects) in without_backprop:
                    before |= BACKWARD_APIS
                if record is None:
                    record = {"stage": view.rank_stage(rank), "step_is_first": view.step == 0}
                yield Site(
                    family=family,
                    observed=before,
                    records=[record],
                    ranks=[rank],
                    stage=view.rank_stage(rank),
                    evidence=lambda before=before, then=then, objects=objects: dict(
                        {"calls_before": sorted(before), "then": then},
                        **({"optimizers": sorted(objects)} if objects else {})),
                )

    def params(self, family: tuple, value: Any) -> dict[str, Any]:
        return {"first": value, "then": family[1]}

    def key(self, params: Mapping[str, Any]) -> tuple[tuple, Any]:
        return ("seq", str(params["then"])), str(params["first"])

    def needs(self, params: Mapping[str, Any]) -> FactPlan:
        apis = {params["first"], params["then"], OPTIMIZER_STEP}  # steps say which iterations are first
        if TENSOR_BACKWARD in apis:  # torch.autograd.backward is that fact too (`identity.call_facts`)
            apis |= BACKWARD_APIS
        if OPTIMIZER_ZERO_GRAD in apis:  # a Module.zero_grad or a clear by hand is a zero_grad too
            apis |= {MODULE_ZERO_GRAD, GRAD_CLEAR_API}
        return FactPlan(apis=apis, args={}, state_points=set(), state_attrs=set())

    def describe(self, params: Mapping[str, Any]) -> str:
        return f"in every step that calls {params['then']}, {params['first']} is called before it"

    def hint(self, params: Mapping[str, Any]) -> str:
        return (f"{params['first']} was skipped or moved after {params['then']} in this step "
                "(a refactored training loop, an early `continue`, a misplaced call)")

    def violation_evidence(self, params: Mapping[str, Any], site: Site) -> dict[str, Any]:
        return dict(site.get_evidence(), missing_before=params["first"])


def _first_step(view: WindowView, rank: int) -> bool:
    return any(call["api"] == OPTIMIZER_STEP and call.get("trained") is False and call.get("parent") is None
               for call in view.calls(rank))
