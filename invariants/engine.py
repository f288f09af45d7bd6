"""The incremental step-window engine that every checker drives.

Shaped as a reducer so a stream processor can keep its state in tables::

    engine = Engine(invariant_set)
    window = engine.new_window(run, step)       # per (run, step) table entry
    engine.add_batch(window, batch)             # fold each arriving batch
    if engine.is_complete(window):              # every rank reported the step end
        violations = engine.evaluate(window, run_state)   # then evict the window

`WindowState` and `RunState` serialise to msgpack bytes.  Evaluation reads only the
window (and writes run-level bookkeeping), so the violations of a step do not depend
on the order in which ranks' batches arrived or windows closed.  The in-memory driver
used by offline ``check``, inference and tests is `invariants.step_windows`.
"""

from __future__ import annotations

from typing import Any

import msgpack

from .events import Batch
from .invariant_set import InvariantSet
from .model import Violation
from .precondition import needs_records
from .relations import ALL_RANKS_REPORT
from .relations.base import Checking
from .relations.view import WindowView
from .relations.baselines import FIRST_ITERATION_STEP, merge_baselines, replication_baseline, tie_baseline
from .relations.precision import StablePrecision, learn_precisions
from .relations.stable_variables import variable_counts
from .window import LISTED_RANKS, FactPlan, WindowState

#: Offending sites listed per violation; the count of all of them is always reported.
MAX_EVIDENCE_ITEMS = 5


class RunState:
    """Per-run bookkeeping across windows: which steps are closed, what ranks last said.

    Closed steps are a watermark plus the closed steps above it, so the "is this batch
    late?" answer is exact and the state stays small while windows close roughly in order.
    """

    __slots__ = ("run", "world", "closed_below", "closed_above", "last_step_by_rank", "windows_closed", "violations",
                 "rank_local", "variable_counts", "ties", "precisions", "ended_runs")

    def __init__(self, run: str) -> None:
        self.run = run
        self.world = 0
        self.closed_below = 0  # every step < this is closed
        self.closed_above: set[int] = set()
        self.last_step_by_rank: dict[int, int] = {}
        self.windows_closed = 0
        self.violations = 0
        #: attr -> variables that differ across ranks from step 0 on while others agree
        #: (expert/tensor-parallel shards): cross-rank rules skip them.  Set by step 0.
        self.rank_local: dict[str, list[str]] = {}
        #: at -> rank -> variables snapshotted at step 0 (StableVariables' baseline)
        self.variable_counts: dict[str, dict[int, int]] = {}
        #: [alias, primary] pairs of tied variables at step 0 (Consistent scope "aliases")
        self.ties: list[list[str]] = []
        #: model|module path -> dtypes of its previous training iteration (StablePrecision)
        self.precisions: dict[str, list[str]] = {}
        #: rank -> the step whose window held its ``run_end``: a rank that ended its run
        #: is not missing from later steps (uneven work per rank, one done first)
        self.ended_runs: dict[int, int] = {}

    def is_closed(self, step: int) -> bool:
        """A batch for a closed step is late: the caller counts it and drops it."""
        return step < self.closed_below or step in self.closed_above

    def mark_closed(self, step: int) -> None:
        if step < self.closed_below:
            return
        self.closed_above.add(step)
        while self.closed_below in self.closed_above:
            self.closed_above.discard(self.closed_below)
            self.closed_below += 1

    def to_bytes(self) -> bytes:
        return msgpack.packb(
            [self.run, self.world, self.closed_below, sorted(self.closed_above), self.last_step_by_rank,
             self.windows_closed, self.violations, self.rank_local, self.variable_counts, self.ties,
             self.precisions, self.ended_runs],
            use_bin_type=True,
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> "RunState":
        run, world, below, above, last, closed, violations, *rest = msgpack.unpackb(data, raw=False, strict_map_key=False)
        state = cls(run)
        state.rank_local = dict(rest[0]) if rest else {}
        counts = rest[1] if len(rest) > 1 else {}
        state.variable_counts = {at: {int(r): n for r, n in per.items()} for at, per in counts.items()}
        state.ties = [list(pair) for pair in rest[2]] if len(rest) > 2 else []
        state.precisions = {str(key): list(dtypes) for key, dtypes in rest[3].items()} if len(rest) > 3 else {}
        state.ended_runs = {int(rank): int(step) for rank, step in rest[4].items()} if len(rest) > 4 else {}
        state.world, state.closed_below, state.closed_above = world, below, set(above)
        state.last_step_by_rank = {int(k): v for k, v in last.items()}
        state.windows_closed, state.violations = closed, violations
        return state


class Engine:
    def __init__(self, invariant_set: InvariantSet, *, report_missing_ranks: bool = True,
                 plan: FactPlan | None = None) -> None:
        """``plan``: the facts windows keep; the deployed set's needs unless given
        (inference keeps everything, since any rule may be learned)."""
        self.invariant_set = invariant_set
        self.plan: FactPlan = plan if plan is not None else invariant_set.plan
        self.report_missing_ranks = report_missing_ranks

    @property
    def invariants(self) -> list:
        """The deployed invariants (for counts and listings)."""
        return self.invariant_set.invariants

    def new_window(self, run: str, step: int) -> WindowState:
        return WindowState(run, step)

    def add_batch(self, window: WindowState, batch: Batch) -> None:
        window.add_batch(batch, self.plan)

    def is_complete(self, window: WindowState) -> bool:
        return window.is_complete()

    def evaluate(self, window: WindowState, run_state: RunState) -> list[Violation]:
        """Violations of one closed window.

        Reads only the window, except for run-level facts learned at step 0: which
        variables are rank-local (`replication_baseline`, completed at the first
        iteration, step 1, where shards first part) and how many variables each
        snapshot point tracks (`variable_counts`).  Windows that close before
        step 0 (or, for shards that part at their first update, step 1) does -- only
        possible when streaming out of order -- judge every variable.
        """
        if window.step == 0:
            run_state.rank_local = replication_baseline(window)
            run_state.variable_counts = variable_counts(window)
            run_state.ties = tie_baseline(window)
        elif window.step == FIRST_ITERATION_STEP:
            run_state.rank_local = merge_baselines(run_state.rank_local,
                                                  replication_baseline(window, before_update=True))
        view = WindowView(window, run_state.rank_local, run_state.variable_counts, run_state.ties,
                          run_state.precisions)
        found: dict[str, Violation] = {}
        counts: dict[str, int] = {}
        for template, mode in self._checks():
            holds, applicable = template.holds, template.applicable
            families = mode.families
            for site in template.sites(view, mode):
                for compiled in families.get(site.family, ()):
                    value = compiled.value
                    if value is None:
                        if site.observed:
                            continue
                    elif not applicable(value, site) or holds(value, site):
                        continue
                    predicate = compiled.predicate
                    # records are built only for rules with a precondition to test
                    if needs_records(predicate) and not predicate(site.get_records()):
                        continue
                    self._record(found, counts, compiled, template, site, window)
        if self.report_missing_ranks and window.missing_count():
            self._record_missing(found, window, run_state.ended_runs)
        violations = sorted(found.values(), key=lambda v: v.invariant)
        for vid, count in counts.items():
            if count > 1:
                found[vid].evidence["sites"] = count
        self._update_run_state(window, run_state, len(violations))
        if self._learns_precisions():
            learn_precisions(view, run_state.precisions)
        return violations

    def _learns_precisions(self) -> bool:
        """Whether a deployed rule reads the precision baseline (only then is it kept)."""
        return any(template.relation == StablePrecision.relation for template, _ in self._checks())

    def _checks(self) -> list[tuple[Any, Checking]]:
        """(template, checking mode) per relation of the deployed set.

        Built on the first evaluation and kept with the set it was built from: check
        plans depend on the deployed families only, never on a window.
        """
        cached = getattr(self, "_checks_of", None)
        if cached is None or cached[0] is not self.invariant_set:
            checks = []
            for families in self.invariant_set.by_family.values():
                template = next(iter(families.values()))[0].template
                checks.append((template, Checking.of(template, families)))
            cached = self._checks_of = (self.invariant_set, checks)
        return cached[1]

    def _record(self, found: dict[str, Violation], counts: dict[str, int], compiled: Any, template: Any,
                site: Any, window: WindowState) -> None:
        """Count a failing site; its evidence is built only while the violation keeps it."""
        inv = compiled.invariant
        existing = found.get(inv.id)
        if existing is None:
            found[inv.id] = Violation(
                invariant=inv.id,
                relation=inv.relation,
                description=inv.description or template.describe(inv.params),
                run=window.run,
                step=window.step,
                ranks=sorted(set(site.ranks)),
                stage=site.stage or window.stage(),
                evidence={"first": template.violation_evidence(inv.params, site)},
                hint=template.hint(inv.params),
            )
            counts[inv.id] = 1
            return
        counts[inv.id] += 1
        ranks = existing.ranks
        if any(rank not in ranks for rank in site.ranks):
            existing.ranks = sorted(set(ranks) | set(site.ranks))
        more = existing.evidence.setdefault("more", [])
        if len(more) < MAX_EVIDENCE_ITEMS - 1:
            more.append(template.violation_evidence(inv.params, site))

    def _record_missing(self, found: dict[str, Violation], window: WindowState, ended_runs: dict[int, int]) -> None:
        """Counts are exact; rank numbers are listed up to `LISTED_RANKS` each, so the
        record stays small however large the declared world is.  Ranks whose run ended
        in an earlier window finished their work (a federated client with fewer
        rounds, a rank with less data): not missing."""
        inv = ALL_RANKS_REPORT
        finished = {rank for rank, step in ended_runs.items() if step < window.step and rank not in window.ranks}
        missing = [rank for rank in window.missing_ranks(LISTED_RANKS + len(finished))
                   if rank not in finished][:LISTED_RANKS]
        if not missing:
            return
        reported = sorted(r for r, f in window.ranks.items() if f.ended)
        found[inv.id] = Violation(
            invariant=inv.id,
            relation=inv.relation,
            description=inv.description,
            run=window.run,
            step=window.step,
            ranks=missing,
            stage=window.stage(),
            evidence={"first": self._missing_evidence(window.world, missing, reported, len(finished))},
            hint="a rank is stalled, crashed or lost its connection; the others may hang at the next collective",
        )

    @staticmethod
    def _missing_evidence(world: int, missing: list[int], reported: list[int], finished: int) -> dict[str, Any]:
        """World, missing and reported ranks; a list cut to `LISTED_RANKS` comes with its
        exact count (small jobs keep the plain lists)."""
        evidence: dict[str, Any] = {"world": world, "missing": missing, "reported": reported[:LISTED_RANKS]}
        if finished:
            evidence["finished_count"] = finished
        missing_count = world - len(reported) - finished
        if missing_count > len(missing):
            evidence["missing_count"] = missing_count
        if len(reported) > LISTED_RANKS:
            evidence["reported_count"] = len(reported)
        return evidence

    @staticmethod
    def _update_run_state(window: WindowState, run_state: RunState, violations: int) -> None:
        run_state.world = max(run_state.world, window.world)
        run_state.mark_closed(window.step)
        run_state.windows_closed += 1
        run_state.violations += violations
        for rank, facts in window.ranks.items():
            if facts.ended and window.step > run_state.last_step_by_rank.get(rank, -1):
                run_state.last_step_by_rank[rank] = window.step
            if facts.run_end is not None:
                run_state.ended_runs[rank] = window.step
