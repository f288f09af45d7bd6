"""What a verdict covered: training iterations, setup windows, windows left unchecked and why.

"No violation" is only worth what was checked.  A run whose optimizer step was never
reached, an evaluation job, or a trace cut after model construction holds no training
iteration an invariant can judge; calling that "OK" would hide exactly the runs a user
most needs to look at.  So every verdict (`check`, `watch`, `serve`) carries the
numbers built here, and "no training iteration" is a verdict of its own.

What a window held is folded with the window (`note_step_end`, `note_meta`, and the
optimizer-step count in `window.WindowState.add_batch`) and read when it closes
(`window_coverage`).  Producers that follow the run model mark the setup window
(``setup: true``) and training iterations (``trained: true``) on the step end;
older traces carry neither, and there a window is an iteration when it holds an
optimizer step call, and step 0 (which then also holds setup) is the setup window.

Pure: no I/O; `coverage_text` words the numbers, callers print, serialise or export them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .events import PRODUCER_STATS_META, RUN_END_META, RUN_START_META
from .rank_facts import RankFacts

if TYPE_CHECKING:
    from .window import WindowState

#: Why a rank's window was not checked (per rank and window).  A fixed set: metric labels.
MISSING_RANK = "missing_rank"  # the window closed without this rank's step end
UNFINISHED = "unfinished"  # input ended inside a window no rank finished (trace cut, job killed)
#: Why batches never reached a window (per batch; which window they belonged to is unknown).
LATE_BATCH = "late_batch"  # arrived after its window was closed and judged
LOST_BATCH = "lost_batch"  # a gap in a process's batch sequence numbers

#: Missing ranks listed per window; more are counted, not named (a hostile world size).
MAX_NAMED_MISSING = 64


def _count(value: Any) -> int | None:
    return value if value.__class__ is int and value >= 0 else None


def note_step_end(facts: RankFacts, event: Any) -> None:
    """Keep what a rank's step end says the window held (run model flags)."""
    if event.setup is True:
        facts.setup = True
    if event.trained.__class__ is bool:
        facts.trained = event.trained
    if event.unsampled is True:
        facts.unsampled = True


def note_meta(facts: RankFacts, event: Any) -> None:
    """Keep the producer's own account: run_end counts, dropped batches, snapshot sampling."""
    what = event.what
    if what == RUN_END_META:
        facts.run_end = [_count(event.iterations), _count(event.optimizer_steps)]
        facts.left_out_calls = _count(event.left_out_calls) or 0
        facts.separate_model = event.separate_models is True
    elif what == PRODUCER_STATS_META:
        dropped = _count(event.dropped_batches)
        if dropped:  # cumulative per process: the newest is the largest
            facts.dropped_batches = max(facts.dropped_batches, dropped)
        budget, share = event.overhead_budget, event.overhead_share
        if budget.__class__ is float and share.__class__ in (float, int):
            facts.overhead = [budget, float(share)]
    elif what == RUN_START_META and isinstance(event.config, dict):
        every = _count(event.config.get("sample_every"))
        if every and every > 1:
            facts.sample_every = every


@dataclass(frozen=True)
class RankWindow:
    """One rank's part of a closed window, as far as coverage is concerned."""

    rank: int
    iteration: bool
    setup: bool
    optimizer_steps: int = 0
    #: run_end's (iterations, optimizer steps) when this window held it
    reported: tuple[int | None, int | None] | None = None
    left_out_calls: int = 0
    separate_model: bool = False
    dropped_batches: int = 0
    sample_every: int = 1
    unsampled: bool = False
    overhead: tuple[float, float] | None = None


@dataclass(frozen=True)
class WindowCoverage:
    run: str
    step: int
    world: int
    checked: tuple[RankWindow, ...]
    missing: int
    missing_ranks: tuple[int, ...]  # the first `MAX_NAMED_MISSING` of them

    @property
    def iterations(self) -> int:
        return sum(r.iteration for r in self.checked)

    @property
    def setup_windows(self) -> int:
        return sum(r.setup for r in self.checked)

    @property
    def optimizer_steps(self) -> int:
        return sum(r.optimizer_steps for r in self.checked)


def window_coverage(window: WindowState) -> WindowCoverage:
    """What one closing window checked, per rank that reported its end."""
    checked = []
    for rank, facts in sorted(window.ranks.items()):
        if not facts.ended:
            continue
        steps = facts.optimizer_steps
        trained = facts.trained
        marked = facts.setup or trained is not None  # a producer of the run model
        reported = facts.run_end
        checked.append(RankWindow(
            rank=rank,
            iteration=trained if trained is not None else steps > 0,
            setup=facts.setup or (window.step == 0 and not marked),
            optimizer_steps=steps,
            reported=(reported[0], reported[1]) if reported else None,
            left_out_calls=facts.left_out_calls,
            separate_model=facts.separate_model,
            dropped_batches=facts.dropped_batches,
            sample_every=facts.sample_every,
            unsampled=facts.unsampled,
            overhead=(facts.overhead[0], facts.overhead[1]) if facts.overhead else None,
        ))
    ended = {r.rank for r in checked}
    missing = max(0, window.world - len(ended))
    named: list[int] = []
    for rank in range(window.world):
        if len(named) >= MAX_NAMED_MISSING:
            break
        if rank not in ended:
            named.append(rank)
    return WindowCoverage(window.run, window.step, window.world, tuple(checked), missing, tuple(named))


@dataclass
class RankCoverage:
    iterations: int = 0
    setup_checked: bool = False
    other_windows: int = 0  # checked windows that were neither setup nor an iteration (final evaluation)
    optimizer_steps: int = 0  # optimizer step calls in checked windows
    missing_windows: int = 0
    unsnapshotted: int = 0  # iterations the producer took no parameter snapshots in (sampling)
    reported_iterations: int | None = None
    reported_optimizer_steps: int | None = None
    left_out_calls: int = 0  # trainer calls made without a backward that the producer did not record
    separate_model: bool = False  # never synchronised gradients: parameters not compared across ranks
    dropped_batches: int = 0


@dataclass
class RunCoverage:
    """A run's coverage, accumulated window by window."""

    run: str
    world: int = 0
    ranks: dict[int, RankCoverage] = field(default_factory=dict)
    unchecked_windows: dict[str, int] = field(default_factory=dict)  # reason -> rank-windows
    lost_batches: dict[str, int] = field(default_factory=dict)  # reason -> batches
    sample_every: int = 1
    #: (budget, largest share a rank measured) of producers under an overhead budget
    overhead: tuple[float, float] | None = None

    def rank(self, rank: int) -> RankCoverage:
        found = self.ranks.get(rank)
        if found is None:
            found = self.ranks[rank] = RankCoverage()
        return found

    def add(self, window: WindowCoverage) -> None:
        self.world = max(self.world, window.world)
        for part in window.checked:
            self.sample_every = max(self.sample_every, part.sample_every)
            if part.overhead is not None:
                share = max(part.overhead[1], self.overhead[1]) if self.overhead else part.overhead[1]
                self.overhead = (part.overhead[0], share)
        for part in window.checked:
            rc = self.rank(part.rank)
            rc.optimizer_steps += part.optimizer_steps
            rc.dropped_batches = max(rc.dropped_batches, part.dropped_batches)
            rc.left_out_calls = max(rc.left_out_calls, part.left_out_calls)
            rc.separate_model = rc.separate_model or part.separate_model
            if part.iteration:
                rc.iterations += 1
                if part.unsampled or window.step % self.sample_every:
                    rc.unsnapshotted += 1
            rc.setup_checked = rc.setup_checked or part.setup
            if not part.iteration and not part.setup:
                rc.other_windows += 1
            if part.reported is not None:
                rc.reported_iterations, rc.reported_optimizer_steps = part.reported
        for rank in window.missing_ranks:
            self.rank(rank).missing_windows += 1
        if window.missing:
            self.note_unchecked(MISSING_RANK, window.missing)

    def note_unchecked(self, reason: str, windows: int = 1) -> None:
        self.unchecked_windows[reason] = self.unchecked_windows.get(reason, 0) + windows

    def note_lost(self, reason: str, batches: int) -> None:
        if batches:
            self.lost_batches[reason] = self.lost_batches.get(reason, 0) + batches

    # -- totals --------------------------------------------------------------------
    @property
    def iterations(self) -> int:
        return sum(r.iterations for r in self.ranks.values())

    @property
    def optimizer_steps(self) -> int:
        return sum(r.optimizer_steps for r in self.ranks.values())

    @property
    def setup_ranks(self) -> list[int]:
        return sorted(rank for rank, r in self.ranks.items() if r.setup_checked)

    def reported_not_checked(self) -> int:
        """Iterations the producers report (run_end) beyond those checked on the same ranks."""
        return sum(max(0, r.reported_iterations - r.iterations)
                   for r in self.ranks.values() if r.reported_iterations is not None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "world": self.world,
            "iterations": self.iterations,
            "optimizer_steps": self.optimizer_steps,
            "setup_checked_ranks": self.setup_ranks,
            "windows_unchecked": sum(self.unchecked_windows.values()),
            "unchecked_windows": dict(sorted(self.unchecked_windows.items())),
            "lost_batches": dict(sorted(self.lost_batches.items())),
            "producer_dropped_batches": sum(r.dropped_batches for r in self.ranks.values()),
            "sample_every": self.sample_every,
            "overhead_budget": self.overhead[0] if self.overhead else None,
            "overhead_share": self.overhead[1] if self.overhead else None,
            "ranks": [
                {"rank": rank, "iterations": r.iterations, "setup_checked": r.setup_checked,
                 "other_windows": r.other_windows, "optimizer_steps": r.optimizer_steps,
                 "missing_windows": r.missing_windows, "unsnapshotted_iterations": r.unsnapshotted,
                 "reported_iterations": r.reported_iterations,
                 "reported_optimizer_steps": r.reported_optimizer_steps, "dropped_batches": r.dropped_batches,
                 "left_out_calls": r.left_out_calls, "separate_model": r.separate_model}
                for rank, r in sorted(self.ranks.items())
            ],
        }


class SequenceGaps:
    """Batches lost on the way, from each process's sequence numbers (0, 1, 2, ...).

    Keeps a count and the highest number per process, not the numbers themselves, so
    it stays small on long runs; a process's numbers never repeat.
    """

    def __init__(self) -> None:
        self._seen: dict[tuple[str, int, Any], list[int]] = {}

    def see(self, run: str, rank: int, pid: Any, seq: int) -> None:
        entry = self._seen.get((run, rank, pid))
        if entry is None:
            self._seen[(run, rank, pid)] = [1, seq]
        else:
            entry[0] += 1
            entry[1] = max(entry[1], seq)

    def lost(self) -> dict[str, int]:
        """run -> batches missing below each process's highest sequence number."""
        per_run: dict[str, int] = {}
        for (run, _, _), (count, highest) in self._seen.items():
            per_run[run] = per_run.get(run, 0) + max(0, highest + 1 - count)
        return per_run


class Coverage:
    """The coverage of every run one verdict speaks about (wired to `engine.StepWindows`)."""

    def __init__(self) -> None:
        self.runs: dict[str, RunCoverage] = {}
        self.sequence = SequenceGaps()

    def run(self, name: str) -> RunCoverage:
        found = self.runs.get(name)
        if found is None:
            found = self.runs[name] = RunCoverage(name)
        return found

    def window_closed(self, window: WindowState) -> None:
        self.run(window.run).add(window_coverage(window))

    def window_unfinished(self, window: WindowState) -> None:
        """A window the input ended in before any rank finished it: none of its ranks was checked."""
        self.run(window.run).note_unchecked(UNFINISHED, max(window.world, len(window.ranks), 1))

    def finish(self) -> None:
        for run, lost in self.sequence.lost().items():
            self.run(run).note_lost(LOST_BATCH, lost)

    def trained(self) -> list[RunCoverage]:
        return [r for r in self.runs.values() if r.iterations]

    def untrained(self) -> list[RunCoverage]:
        return [r for r in self.runs.values() if not r.iterations]

    def to_dict(self, violations: int) -> dict[str, Any]:
        """``verdict``: ``violations``, ``nothing_checked`` (a run without a training
        iteration and no violation) or ``ok``."""
        verdict = "violations" if violations else ("nothing_checked" if self.untrained() or not self.runs else "ok")
        return {
            "verdict": verdict,
            "iterations": sum(r.iterations for r in self.runs.values()),
            "runs_without_iterations": [r.run for r in self.untrained()],
            "runs": [r.to_dict() for r in self.runs.values()],
        }
