"""Run the run-model benchmark programs zero-config and print what a user would see.

    python benchmarks/frameworks/run.py [--suite frameworks|run-model|all] [--jobs 2] [--only ID ...]

Every program — the framework programs of ``programs.py`` and the run-model cases of
``silent_bugs/registry.py`` (each bug with its healthy twin, plus the healthy-only
programs) — runs under ``trainwatch collect`` and is checked with ``trainwatch check
--report-json`` and no ``-i`` (the shipped default set). One row per run: healthy or bug,
the check's exit code, its first violation (relation, description, step), the windows it
checked, what the trace holds (setup window, iterations) and a verdict: ``clean`` /
``FALSE ALARM`` for healthy runs, ``caught (+d)`` / ``late`` / ``missed`` for bugs, with
``first violation is the bug`` judged against the twin (an invariant the twin violates
too is not the bug). Rows are written to ``WORK/results.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "silent_bugs"), str(HERE.parents[1])]

import harness  # noqa: E402
from programs import PROGRAMS, FrameworkProgram  # noqa: E402
from registry import RUN_MODEL_BUGS, RUN_MODEL_HEALTHY, BugCase, onset_step  # noqa: E402
from scoring import score  # noqa: E402
from trace_facts import TraceFacts, trace_facts  # noqa: E402

DEFAULT_WORK = HERE / ".work"
RESULTS = HERE.parent / "RESULTS.md"
BEGIN, END = "<!-- run-model:begin -->", "<!-- run-model:end -->"


@dataclass(frozen=True)
class Job:
    """One run to collect and check."""

    id: str
    suite: str
    command: list[str]
    bug: bool
    twin: str | None = None  # the id of the healthy run this bug is judged against
    onset: int = 0  # training iteration, from 0
    in_setup: bool = False
    root_cause: tuple[str, ...] = ()
    timeout_s: float = 300.0


@dataclass
class Row:
    id: str
    suite: str
    kind: str  # "healthy" | "bug"
    collect_exit: int
    seconds: float
    check_exit: int
    check_error: str
    windows_checked: int
    facts: TraceFacts
    violations: int
    violated: list[str] = field(default_factory=list)  # descriptions, first step first
    first: dict[str, Any] | None = None  # relation, description, step, stage
    first_step_relations: list[str] = field(default_factory=list)  # every relation violated at first's step
    onset_step: int | None = None
    verdict: str = ""
    first_is_bug: bool | None = None
    #: the report's ``summary.coverage.verdict``: "nothing_checked" for a program that never trains
    coverage: str = ""


def jobs_for(suite: str, python: str = sys.executable) -> list[Job]:
    jobs: list[Job] = []
    if suite in ("run-model", "all"):
        for case in RUN_MODEL_BUGS:
            jobs.append(_bug_job(case, python))
            jobs.append(Job(f"{case.id}.twin", "run-model", case.command(python, bug=False), bug=False))
        for program in RUN_MODEL_HEALTHY:
            jobs.append(Job(program.id, "run-model", program.command(python), bug=False))
    if suite in ("frameworks", "all"):
        jobs.extend(_framework_job(program, python) for program in PROGRAMS)
    return jobs


def _bug_job(case: BugCase, python: str) -> Job:
    return Job(case.id, "run-model", case.command(python, bug=True), bug=True, twin=f"{case.id}.twin",
               onset=case.onset, in_setup=case.in_setup, root_cause=case.root_cause)


def _framework_job(program: FrameworkProgram, python: str) -> Job:
    return Job(program.id, "frameworks", program.command(python), bug=not program.healthy, twin=program.twin,
               onset=program.onset, root_cause=program.root_cause, timeout_s=600.0)


def collect_and_check(job: Job, work: Path) -> tuple[harness.CollectResult, harness.CheckResult, TraceFacts]:
    """Collect and check one program (`harness.collect` runs a gloo teardown abort again)."""
    trace_dir = work / job.suite / job.id
    collected = harness.collect(job.command, trace_dir, run_id=job.id.replace(".", "-"), timeout_s=job.timeout_s)
    if not any(trace_dir.glob("*.twtrace")):
        return collected, harness.CheckResult(-1, error=f"no trace: {collected.output_tail[-300:]}"), TraceFacts()
    checked = harness.check(trace_dir, work / job.suite / f"{job.id}.report.json")
    return collected, checked, trace_facts(trace_dir)


def _first(violations: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not violations:
        return None
    v = min(violations, key=lambda item: item.get("step", 0))
    return {"relation": v.get("relation"), "description": v.get("description"), "step": v.get("step"),
            "stage": v.get("stage"), "ranks": v.get("ranks"), "invariant": v.get("invariant")}


def make_row(job: Job, collected: harness.CollectResult, checked: harness.CheckResult, facts: TraceFacts) -> Row:
    ordered = sorted(checked.violations, key=lambda v: v.get("step", 0))
    violated = list(dict.fromkeys(v.get("description", "?") for v in ordered))
    at_first = sorted({v.get("relation", "?") for v in ordered if v.get("step") == ordered[0].get("step")}) if ordered else []
    return Row(job.id, job.suite, "bug" if job.bug else "healthy", collected.returncode,
               round(collected.seconds, 1), checked.exit_code,
               checked.error, int(checked.report.get("summary", {}).get("windows", 0)), facts, len(ordered),
               violated, _first(ordered), at_first,
               coverage=str(checked.report.get("summary", {}).get("coverage", {}).get("verdict", "")))


def judge(row: Row, job: Job, bug_violations: list[dict[str, Any]], twin_violations: list[dict[str, Any]]) -> None:
    """Fill in the verdict: a healthy run must be clean; a bug must be reported within one
    step of its onset by an invariant its twin does not violate, and should come first."""
    if not job.bug:
        # a program that never trains is clean when its setup window is: check exits 2
        # there (nothing trained to judge) and says so in the report's coverage
        never_trained = row.check_exit == 2 and row.coverage == "nothing_checked" and row.windows_checked > 0
        row.verdict = "clean" if (row.check_exit == 0 or never_trained) and not row.violations else (
            "FALSE ALARM" if row.violations else f"error (exit {row.check_exit})")
        return
    row.onset_step = onset_step(job.onset, in_setup=job.in_setup, setup_window=row.facts.setup_window)
    detection = score(bug_violations, row.onset_step, job.root_cause, twin_violations)
    if detection.first_step is None:
        row.verdict = "missed"
    else:
        row.verdict = f"caught (+{detection.delay})" if detection.detected else f"late (+{detection.delay})"
    shared = {v.get("invariant") for v in twin_violations}
    row.first_is_bug = bool(row.first) and row.first["invariant"] not in shared and row.first["step"] >= row.onset_step


def run(jobs: list[Job], work: Path, parallel: int) -> list[Row]:
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        outcomes = dict(zip((job.id for job in jobs), pool.map(lambda job: collect_and_check(job, work), jobs)))
    rows = []
    for job in jobs:
        collected, checked, facts = outcomes[job.id]
        row = make_row(job, collected, checked, facts)
        twin = outcomes.get(job.twin)[1].violations if job.twin in outcomes else []
        judge(row, job, checked.violations, twin)
        rows.append(row)
    return rows


def _cell(text: Any, width: int) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= width else text[: width - 1] + "…"


def render(rows: list[Row]) -> str:
    head = f"{'program':36s} {'kind':7s} {'col':>3s} {'chk':>3s} {'win':>4s} {'setup':5s} {'iters':>5s} " \
           f"{'onset':>5s} {'verdict':12s} {'1st=bug':7s} first violation (step: relation: description)"
    lines = [head, "-" * len(head)]
    for r in rows:
        first = f"{r.first['step']}: {r.first['relation']}: {r.first['description']}" if r.first else (
            r.check_error or "—")
        lines.append(
            f"{_cell(r.id, 36):36s} {r.kind:7s} {r.collect_exit:>3d} {r.check_exit:>3d} {r.windows_checked:>4d} "
            f"{'yes' if r.facts.setup_window else 'no':5s} {_cell(r.facts.iterations, 5):>5s} "
            f"{_cell(r.onset_step, 5):>5s} {r.verdict:12s} {_cell(r.first_is_bug, 7):7s} {_cell(first, 140)}")
    healthy = [r for r in rows if r.kind == "healthy"]
    bugs = [r for r in rows if r.kind == "bug"]
    lines += ["", f"healthy clean: {sum(r.verdict == 'clean' for r in healthy)} / {len(healthy)}; "
                  f"bugs caught within one step: {sum(r.verdict.startswith('caught') for r in bugs)} / {len(bugs)} "
                  f"(first violation is the bug: {sum(bool(r.first_is_bug) for r in bugs)})"]
    return "\n".join(lines)


def render_markdown(rows: list[Row], command: str, versions: str, minutes: float) -> str:
    """The RESULTS.md section: the same rows as the console table."""
    lines = [BEGIN, "## Run-model and framework programs (`benchmarks/frameworks/run.py`)", "",
             f"Command: `{command}` — {minutes:.1f} min on 2 CPU cores, one training thread per rank; {versions}; zero-config (`trainwatch collect` + `trainwatch check` with the "
             "default set). Onsets are trace steps (iteration + 1 when the trace opens with a setup window); "
             "a bug counts when an invariant its twin does not violate fires at the onset or the next step.", "",
             "| program | kind | check exit | windows | setup window | iterations | onset step | verdict "
             "| first is the bug | first violation (step: relation: description) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        first = f"{r.first['step']}: {r.first['relation']}: {r.first['description']}" if r.first else "—"
        first = first.replace("|", "\\|")
        lines.append(f"| `{r.id}` | {r.kind} | {r.check_exit} | {r.windows_checked} | "
                     f"{'yes' if r.facts.setup_window else 'no'} | {'—' if r.facts.iterations is None else r.facts.iterations} | "
                     f"{'—' if r.onset_step is None else r.onset_step} | {r.verdict} | "
                     f"{'—' if r.first_is_bug is None else ('yes' if r.first_is_bug else 'no')} | "
                     f"{first} |")
    summary = render(rows).splitlines()[-1]
    return "\n".join(lines + ["", summary, END]) + "\n"


def write_results(section: str) -> None:
    text = RESULTS.read_text(encoding="utf-8")
    if BEGIN in text and END in text:
        head, _, rest = text.partition(BEGIN)
        text = head + section.rstrip("\n") + rest.partition(END)[2]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    RESULTS.write_text(text, encoding="utf-8")


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in ("torch", "transformers", "lightning", "accelerate"):
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            found.append(f"{name} not installed")
    return ", ".join(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=("frameworks", "run-model", "all"), default="all")
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK, help="traces, reports and results.json go here")
    parser.add_argument("--jobs", type=int, default=1, help="runs collected in parallel")
    parser.add_argument("--only", nargs="*", default=None, metavar="ID",
                        help="run only these ids (a bug's twin is added; run-model twins are ID.twin)")
    parser.add_argument("--write-results", action="store_true",
                        help=f"rewrite the run-model section of {RESULTS.name} (whole suites only)")
    args = parser.parse_args(argv)
    jobs = jobs_for(args.suite)
    if args.only is not None:
        wanted = set(args.only)
        wanted |= {job.twin for job in jobs if job.id in wanted and job.twin}
        jobs = [job for job in jobs if job.id in wanted]
        if not jobs:
            print(f"run.py: error: no program matches {sorted(args.only)}", file=sys.stderr)
            return 2
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    rows = run(jobs, args.work, max(1, args.jobs))
    (args.work / "results.json").write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n", encoding="utf-8")
    print(render(rows))
    if args.write_results and args.only is None:
        command = "python benchmarks/frameworks/run.py " + " ".join(argv if argv is not None else sys.argv[1:])
        write_results(render_markdown(rows, command.strip(), _versions(), (time.monotonic() - started) / 60))
    return 0


if __name__ == "__main__":
    sys.exit(main())
