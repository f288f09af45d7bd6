"""The words of a coverage verdict, shared by `check`, `watch` and the checker's log.

One wording everywhere, so that a user who learnt to read `check`'s line reads the
others; the numbers come from `coverage` (per rank) or from counters (`CoverageTotals`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .coverage import RunCoverage

#: Up to this many ranks, uneven iteration counts are listed rank by rank.
LISTED_RANKS = 8


def rank_ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    parts: list[str] = []
    for rank in sorted(ranks):
        if parts and rank == parts[-1][1] + 1:
            parts[-1] = (parts[-1][0], rank)
        else:
            parts.append((rank, rank))
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in parts) or "-"


def _plural(n: int, word: str, many: str = "") -> str:
    return f"{n} {word}" if n == 1 else f"{n} {many or word + 's'}"


def _reasons(counts: dict[str, int]) -> str:
    return ", ".join(f"{reason}: {n}" for reason, n in sorted(counts.items()) if n)


def describe_run(run: RunCoverage) -> str:
    """``run r1: ranks 0-1, 60 iterations each; setup window checked; 0 windows unchecked``."""
    ranks = sorted(run.ranks) or list(range(run.world))
    per_rank = [run.ranks[r].iterations if r in run.ranks else 0 for r in ranks]
    label = "rank" if len(ranks) == 1 else "ranks"
    if len(set(per_rank)) <= 1:
        each = "" if len(ranks) == 1 else " each"
        iterations = f"{_plural(per_rank[0] if per_rank else 0, 'iteration')}{each}"
    elif len(per_rank) <= LISTED_RANKS:
        iterations = "iterations " + ", ".join(map(str, per_rank))
    else:
        iterations = f"{min(per_rank)}-{max(per_rank)} iterations per rank"
    parts = [f"run {run.run}: {label} {rank_ranges(ranks)}, {iterations}"]
    setup = run.setup_ranks
    if setup and len(setup) == len(ranks):
        parts.append("setup window checked")
    elif setup:
        parts.append(f"setup window checked on {'rank' if len(setup) == 1 else 'ranks'} {rank_ranges(setup)} only")
    else:
        parts.append("setup window not checked")
    other = sum(r.other_windows for r in run.ranks.values())
    if other:
        parts.append(f"{_plural(other, 'window')} without training checked")
    unchecked = sum(run.unchecked_windows.values())
    parts.append(f"{_plural(unchecked, 'window')} unchecked"
                 + (f" ({_reasons(run.unchecked_windows)})" if unchecked else ""))
    if run.lost_batches:
        lost = sum(run.lost_batches.values())
        parts.append(f"{_plural(lost, 'batch', 'batches')} not checked ({_reasons(run.lost_batches)})")
    dropped = sum(r.dropped_batches for r in run.ranks.values())
    if dropped:  # in any of its sinks: a trace file may still hold what Kafka lost
        parts.append(f"producers report {_plural(dropped, 'dropped batch', 'dropped batches')}")
    unsnapshotted = sum(r.unsnapshotted for r in run.ranks.values())
    if unsnapshotted:
        if run.overhead is not None:
            how = f"overhead budget {run.overhead[0]:.1%}, producer share measured {run.overhead[1]:.1%}"
        else:
            how = f"sampled every {run.sample_every} steps"
        parts.append(f"{_plural(unsnapshotted, 'iteration')} without parameter snapshots ({how})")
    left_out = sum(r.left_out_calls for r in run.ranks.values())
    if left_out:
        parts.append(f"{_plural(left_out, 'optimizer or clipping call')} a trainer made without a backward "
                     "not recorded (a statistics pass)")
    separate = sum(r.separate_model for r in run.ranks.values())
    if separate:
        parts.append(f"{_plural(separate, 'rank')} never synchronised gradients (separate models, "
                     "parameters not compared across ranks)")
    beyond = run.reported_not_checked()
    if beyond:
        parts.append(f"{beyond} more reported by the producer but not checked")
    return "; ".join(parts)


def training_iterations(n: int) -> str:
    return _plural(n, "training iteration")


def ok_line(runs: list[RunCoverage]) -> str:
    """The verdict when nothing was violated and every run trained."""
    total = sum(r.iterations for r in runs)
    return f"OK: no violation in {training_iterations(total)} ({' | '.join(describe_run(r) for r in runs)})"


def nothing_checked_line(run: str, optimizer_steps: int, setup_checked: bool, violations: int = 0) -> str:
    """The verdict for a run with no training iteration: not "OK", whatever held."""
    if setup_checked:
        found = "no violation" if not violations else f"{_plural(violations, 'violation')}"
        where = f"setup window checked: {found}"
    else:
        where = "no setup window checked either"
    return (f"no training iteration recorded for run {run}: {_plural(optimizer_steps, 'optimizer step')}, "
            f"0 training iterations ({where})")


@dataclass(frozen=True)
class CoverageTotals:
    """A run's coverage as counters carry it (`serve`'s metrics, read back by `watch`):
    totals over ranks, no per-rank breakdown (a rank is not a metric label)."""

    run: str
    world: int
    iterations: int
    setup_windows: int  # ranks whose setup window was checked
    optimizer_steps: int
    unchecked_windows: dict[str, int]


def describe_totals(totals: CoverageTotals) -> str:
    """``ranks 0-1; setup window checked; 0 windows unchecked`` (the iterations are the caller's to say)."""
    parts = ["rank 0" if totals.world == 1 else f"ranks 0-{totals.world - 1}" if totals.world else "no rank"]
    if totals.world and totals.setup_windows >= totals.world:
        parts.append("setup window checked")
    else:
        parts.append(f"setup window checked on {totals.setup_windows} of {_plural(totals.world, 'rank')}")
    unchecked = sum(totals.unchecked_windows.values())
    parts.append(f"{_plural(unchecked, 'window')} unchecked"
                 + (f" ({_reasons(totals.unchecked_windows)})" if unchecked else ""))
    return "; ".join(parts)
