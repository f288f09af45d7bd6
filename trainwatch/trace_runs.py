"""Which runs a trace directory holds, so that runs are never mixed silently.

`collect -o DIR` refuses a directory that already holds another run's traces (the old
files would be reported as killed processes of the new run, and `check DIR` would
check both runs as one), and `check` says per run what it checked when the files it
reads disagree on the run id.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Iterable

from invariants.codec import TRACE_SUFFIX, TraceCorruption, decode_batch, iter_frames
from invariants.events import SchemaError


def runs_in_trace_dir(directory: str | Path) -> Counter[str]:
    """Run id -> number of trace files under ``directory`` (as `check` would read them).

    Only each file's first frame is read: every batch of a file carries the same run.
    Files without a readable first frame belong to no run and are not counted.
    """
    runs: Counter[str] = Counter()
    root = Path(directory)
    if not root.is_dir():
        return runs
    for path in sorted(root.rglob(f"*{TRACE_SUFFIX}")):
        run = _first_run(path)
        if run is not None:
            runs[run] += 1
    return runs


def _first_run(path: Path) -> str | None:
    try:
        with path.open("rb") as stream:
            for payload in iter_frames(stream):
                return str(decode_batch(payload)["run"])
    except (OSError, TraceCorruption, SchemaError):
        return None
    return None


def describe_runs(runs: Counter[str], limit: int = 3) -> str:
    """``run a (2 files), run b (1 file)``; more than ``limit`` runs are counted, not named."""
    named = [f"run {run} ({count} file{'s' if count != 1 else ''})" for run, count in sorted(runs.items())]
    if len(named) > limit:
        named = named[:limit] + [f"{len(named) - limit} more run(s)"]
    return ", ".join(named)


def per_run_note(windows_by_run: dict[str, Any], violations: Iterable[Any]) -> str | None:
    """One line saying that several runs were checked, each on its own, with its counts.

    ``windows_by_run`` maps run ids to the engine's per-run state (``windows_closed``).
    Returns None for a single run, where the verdict line already names it.
    """
    if len(windows_by_run) < 2:
        return None
    found = Counter(v.run for v in violations)
    parts = [f"run {run}: {state.windows_closed} step windows, {found[run]} violation(s)"
             for run, state in sorted(windows_by_run.items())]
    return f"note: the traces hold {len(parts)} runs, checked separately: " + "; ".join(parts)
