"""Inference: from healthy traces to a deterministic invariant set.

Traces are replayed through the same window folding as checking (with a plan that
keeps everything); every closed window is handed to every enabled template, whose
sites become evidence:

* boolean family  -> ``Evidence`` (positive / negative signature counters)
* value family    -> one trigger counter per family plus one positive counter per
  value; negatives are ``trigger - positive``, so a hypothesis first seen in the
  third trace still gets the negatives from the first two.

All evidence lives in dicts keyed by hypothesis identity, so adding a trace costs
O(1) per site and nothing is ever re-scanned.  ``finish`` learns a precondition per
surviving hypothesis (dropping those no formula can separate, i.e. that failed on a
reference trace), and returns invariants sorted by id.  No inferred rule is keyed on
a user's module class (`identity.keyed_on_user_class`): ``Net`` in one program is not
``Net`` in another.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

from .engine import Engine
from .step_windows import StepWindows
from .events import Batch
from .invariant_set import InvariantSet
from .model import Invariant
from .precondition_inference import SignatureCache, infer_precondition
from .relations import TEMPLATES
from .relations.base import INFER, Template
from .relations.view import WindowView
from .relations.precision import learn_precisions
from .relations.baselines import FIRST_ITERATION_STEP, merge_baselines, replication_baseline, tie_baseline
from .relations.identity import keyed_on_user_class
from .relations.stable_variables import variable_counts
from .window import FactPlan, WindowState

#: A hypothesis whose examples come in more distinct shapes than this is noise (its
#: precondition would be a list of special cases): it is dropped.  Nothing is ever
#: discarded while counting, so the result does not depend on trace order.
MAX_SIGNATURES = 256


@dataclass
class Evidence:
    positive: Counter = field(default_factory=Counter)
    negative: Counter = field(default_factory=Counter)


def _add(counter: Counter, sig: frozenset, n: int = 1) -> None:
    counter[sig] += n


class Inferencer:
    def __init__(self, relations: Iterable[str] | None = None) -> None:
        names = sorted(TEMPLATES) if relations is None else sorted(relations)
        unknown = [n for n in names if n not in TEMPLATES]
        if unknown:
            raise ValueError(f"unknown relation(s): {', '.join(unknown)} (known: {', '.join(sorted(TEMPLATES))})")
        self.templates: list[Template] = [TEMPLATES[n] for n in names]
        self.boolean: dict[tuple[str, tuple], Evidence] = {}
        self.triggers: dict[tuple[str, tuple], Counter] = {}
        self.values: dict[tuple[str, tuple, Any], Counter] = {}
        self.custom: dict[str, dict[str, Any]] = {}
        self.windows = 0
        self.traces = 0
        #: run -> rank-local variables found at its step 0 (see replication_baseline)
        self.rank_local: dict[str, dict[str, list[str]]] = {}
        self.variable_counts: dict[str, dict[str, dict[int, int]]] = {}
        self.ties: dict[str, list[list[str]]] = {}
        #: run -> model|module path -> dtypes of its previous training iteration
        self.precisions: dict[str, dict[str, list[str]]] = {}
        self._signature = SignatureCache()
        #: per trace: rank-windows seen, and rank-windows per value family (for templates
        #: that only trust families present in most steps of every trace using them)
        self.trace_windows: list[int] = []
        self.family_windows: dict[tuple[str, tuple], Counter] = {}
        #: per (relation, trace): the rank-windows its template judges, where that differs
        self.counted_windows: Counter = Counter()

    # ------------------------------------------------------------------ feeding
    def observe(self, window: WindowState) -> None:
        self.windows += 1
        if not self.trace_windows:
            self.trace_windows.append(0)
        trace = len(self.trace_windows) - 1
        self.trace_windows[trace] += len(window.ranks)
        if window.step == 0:
            self.rank_local[window.run] = replication_baseline(window)
            self.variable_counts[window.run] = variable_counts(window)
            self.ties[window.run] = tie_baseline(window)
        elif window.step == FIRST_ITERATION_STEP:
            self.rank_local[window.run] = merge_baselines(
                self.rank_local.get(window.run), replication_baseline(window, before_update=True))
        precisions = self.precisions.setdefault(window.run, {})
        view = WindowView(window, self.rank_local.get(window.run), self.variable_counts.get(window.run),
                          self.ties.get(window.run), precisions)
        for template in self.templates:
            if template.custom_inference:
                template.infer_observe(view, self.custom.setdefault(template.relation, {}))
                continue
            relation = template.relation
            if template.min_window_fraction:
                self.counted_windows[(relation, trace)] += template.windows_counted(view)
            signature = self._signature
            fields = template.inference_fields
            last_records: Any = None
            sig: frozenset = frozenset()
            for site in template.sites(view, INFER):
                records = site.get_records()
                if records is not last_records:  # sites of one variable/call share their records
                    last_records = records
                    if fields is not None:
                        records = [{k: v for k, v in r.items() if k in fields} for r in records]
                    sig = signature(records)
                if template.is_value_family(site.family):
                    fkey = (relation, site.family)
                    trig = self.triggers.get(fkey)
                    if trig is None:
                        trig = self.triggers[fkey] = Counter()
                    _add(trig, sig)
                    if template.min_window_fraction:
                        self.family_windows.setdefault(fkey, Counter())[trace] += 1
                    for value in site.observed:
                        vkey = (relation, site.family, value)
                        counter = self.values.get(vkey)
                        if counter is None:
                            counter = self.values[vkey] = Counter()
                        _add(counter, sig)
                else:
                    evidence = self.boolean.get((relation, site.family))
                    if evidence is None:
                        evidence = self.boolean[(relation, site.family)] = Evidence()
                    _add(evidence.positive if site.observed else evidence.negative, sig)
        learn_precisions(view, precisions)

    def add_trace(self, batches: Iterable[Batch], *, sorted_by_step: bool = True) -> None:
        """Replay one reference trace.

        ``sorted_by_step``: batches come in step order per run (as `trainwatch.tracedir`
        merges them), so a window is complete once a later step shows up, including
        batches from a rank's worker processes.  Otherwise windows close when every
        rank reported the step end, and later batches of that step are ignored.
        """
        self.traces += 1
        self.trace_windows.append(0)
        engine = Engine(InvariantSet([]), report_missing_ranks=False, plan=FactPlan.everything())
        if sorted_by_step:
            windows = StepWindows.replay(engine, on_close=self.observe)
        else:
            windows = StepWindows(engine, on_close=self.observe)
        for batch in batches:
            windows.feed(batch)
        windows.finish()

    # ------------------------------------------------------------------ results
    def finish(self) -> list[Invariant]:
        found: dict[str, Invariant] = {}
        for template in self.templates:
            for inv in template.infer_finish(self.custom.get(template.relation, {})):
                found[inv.id] = inv
        for (relation, family), evidence in self.boolean.items():
            self._emit(found, TEMPLATES[relation], family, None, evidence.positive, evidence.negative)
        for (relation, family, value), positive in self.values.items():
            if not self._frequent_enough(TEMPLATES[relation], (relation, family)):
                continue
            negative = self.triggers[(relation, family)] - positive
            self._emit(found, TEMPLATES[relation], family, value, positive, negative)
        return sorted(found.values(), key=lambda inv: inv.id)

    def _frequent_enough(self, template: Template, fkey: tuple[str, tuple]) -> bool:
        """In every trace where the family occurs, it occurs in enough of the steps."""
        fraction = template.min_window_fraction
        if not fraction:
            return True
        per_trace = self.family_windows.get(fkey, Counter())
        relation = fkey[0]
        return all(count >= fraction * self.counted_windows[(relation, trace)] for trace, count in per_trace.items())

    def _emit(self, found: dict[str, Invariant], template: Template, family: tuple, value: Any,
              positive: Counter, negative: Counter) -> None:
        pos_total = sum(positive.values())
        if pos_total < template.min_support:
            return
        if len(positive) + len(negative) > MAX_SIGNATURES:
            return
        if negative and not template.allows_precondition(family):
            return
        ok, precondition = infer_precondition(positive, negative)
        if not ok:
            return
        params = template.params(family, value)
        if keyed_on_user_class(params) or not template.keeps_hypothesis(params):
            return
        inv = Invariant(
            relation=template.relation,
            params=params,
            precondition=precondition,
            description=template.describe(params),
            apis=template.apis(params),
            positive=pos_total,
            negative=sum(negative.values()),
        )
        found[inv.id] = inv


def infer(traces: Iterable[Iterable[Batch]], relations: Iterable[str] | None = None) -> list[Invariant]:
    inferencer = Inferencer(relations)
    for batches in traces:
        inferencer.add_trace(batches)
    return inferencer.finish()
