"""Run the whole silent-bug benchmark and write its section of ``benchmarks/RESULTS.md``.

    python benchmarks/silent_bugs/run.py [--jobs 2] [--reuse] [--only ID ...] [--no-build]

1. regenerate the shipped default set from the reference pipelines
   (``build_default_set.py``; skipped with ``--no-build``);
2. collect every reproduction with ``--bug`` and its healthy twin, plus held-out healthy
   runs of every reference pipeline (a seed and length used neither for inference nor
   for curation);
3. ``trainwatch check`` each run twice: with the default set (no ``-i``), and with
   invariants inferred (``trainwatch infer``) from the references plus the bug's own
   healthy twin run with another seed — the "I have a healthy run of this pipeline" mode;
4. score detections (``scoring.py``) and false positives, and write the tables.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import build_default_set  # noqa: E402
from harness import REPO, CollectResult, check, collect_with_traces, infer  # noqa: E402
from invariants.invariant_file import load_default_set  # noqa: E402
from references import REFERENCES  # noqa: E402
from registry import ALL_BUGS, BugCase, onset_step  # noqa: E402
from scoring import FalsePositives, score  # noqa: E402

RESULTS = REPO / "benchmarks" / "RESULTS.md"
BEGIN, END = "<!-- silent-bugs:begin -->", "<!-- silent-bugs:end -->"
TWIN_INFERENCE_SEED = 1
#: wall time of the latest from-scratch run (``--jobs 2``), quoted when traces are reused
FROM_SCRATCH_MINUTES = 17


def collect_bug_runs(case: BugCase, work: Path, reuse: bool) -> dict[str, CollectResult]:
    runs = {"bug": (True, 0), "twin": (False, 0), "twin-ref": (False, TWIN_INFERENCE_SEED)}
    results = {}
    for label, (bug, seed) in runs.items():
        trace_dir = work / "bugs" / case.id / label
        if reuse and trace_dir.is_dir() and any(trace_dir.glob("*.twtrace")):
            results[label] = CollectResult(trace_dir, 0, 0.0, "reused")
            continue
        results[label] = collect_with_traces(case.command(sys.executable, bug=bug, seed=seed), trace_dir,
                                             f"{case.id}-{label}")
    return results


def evaluate_bug(case: BugCase, runs: dict[str, CollectResult], work: Path, default_set: Path | None) -> dict:
    out = work / "bugs" / case.id
    row: dict = {"id": case.id, "onset": case.onset, "collect_rc": {k: r.returncode for k, r in runs.items()},
                 "seconds": round(runs["bug"].seconds, 1)}
    inferred = out / "inferred.json"
    infer([runs["twin-ref"].trace_dir] + [work / "references" / "inference" / ref.id for ref in REFERENCES], inferred)
    for mode, invariants in (("default", default_set), ("inferred", inferred)):
        bug = check(runs["bug"].trace_dir, out / f"check-{mode}-bug.json", invariants)
        twin = check(runs["twin"].trace_dir, out / f"check-{mode}-twin.json", invariants)
        onset = onset_step(case.onset, in_setup=case.in_setup, setup_window=True)  # step 0 is setup
        detection = score(bug.violations, onset, case.root_cause, twin.violations)
        row[mode] = {
            "detection": asdict(detection),
            "check_exit": bug.exit_code,
            "error": bug.error or twin.error,
            "twin_violations": sorted({v.get("description", "?") for v in twin.violations}),
            "twin_checked": twin.invariants_checked,
        }
    return row


def held_out_false_positives(work: Path, jobs: int, reuse: bool, default_set: Path | None) -> dict:
    runs = build_default_set.collect_references(work, "held-out", jobs=jobs, reuse=reuse, **build_default_set.HELD_OUT)
    fp = FalsePositives()
    for ref_id, result in sorted(runs.items()):
        outcome = check(result.trace_dir, work / "held-out" / f"{ref_id}.json", default_set)
        fp.add(ref_id, outcome.invariants_checked, outcome.violations)
    return {"runs": fp.runs, "runs_with_violation": fp.runs_with_violation, "checked": fp.invariants_checked,
            "violated": fp.invariants_violated, "offenders": fp.offenders}


def _cell(items: list[str], limit: int = 2) -> str:
    shown = "; ".join(items[:limit]) + (f"; +{len(items) - limit} more" if len(items) > limit else "")
    return shown.replace("|", "\\|") or "—"


def _detection_cell(d: dict) -> str:
    if d["first_step"] is None:
        return "no"
    verdict = "**yes**" if d["detected"] else "late"
    return f"{verdict} (+{d['delay']})"


def default_set_line(curation: dict) -> list[str]:
    """How the checked default set was made: this run's curation, or, with ``--no-build``
    in a work directory without one, the shipped set as committed."""
    if not curation:
        count = len(load_default_set().invariants)
        return [f"Default set: the shipped set as committed ({count} invariants), not rebuilt by this run "
                "(`--no-build`); how it is built: docs/invariants.md.", ""]
    reasons = ", ".join(f"{n} {kind}" for kind, n in sorted(curation.get("reason_counts", {}).items()))
    rules = curation["rules"]
    return [f"Default set: {curation['kept']} invariants kept of {curation['candidates']} "
            f"inferred from {len(REFERENCES)} reference pipelines (seed {build_default_set.INFERENCE['seed']}, "
            f"{build_default_set.INFERENCE['steps']} steps). Shipping rules: support from at least "
            f"{rules['min_pipelines']} pipelines of {rules['min_styles']} styles, at least "
            f"{rules['min_positives']} positive examples, agreed constants, silent on every healthy "
            f"validation run (seed {build_default_set.VALIDATION['seed']}, {build_default_set.VALIDATION['steps']} "
            f"steps, and the core's synthetic healthy runs). Refusals by reason (one invariant may have several): "
            f"{reasons or 'none'}.", ""]


def render(rows: list[dict], held_out: dict, command: str, seconds: float, curation: dict, reused: bool) -> str:
    lines = [BEGIN, "## Silent-bug benchmark (benchmarks/silent_bugs)", ""]
    lines += [f"Command: `{command}` — {seconds / 60:.1f} min on {platform.machine()} "
              f"({time.strftime('%Y-%m-%d', time.gmtime())}); one training thread per rank, CPU only."
              + (" Traces already in the work directory were reused (`--reuse`); a run "
                 f"from scratch (`run.py --jobs 2`) collects {3 * len(ALL_BUGS) + 3 * len(REFERENCES)} training runs "
                 f"and took {FROM_SCRATCH_MINUTES} min on the 2-core development machine." if reused else ""), ""]
    lines += default_set_line(curation)
    for mode, title in (("default", "shipped default set (`trainwatch check TRACE_DIR`, no `-i`)"),
                        ("inferred", "invariants inferred from the references + the bug's healthy twin (other seed)")):
        detected = sum(1 for r in rows if r[mode]["detection"]["detected"])
        named = sum(1 for r in rows if r[mode]["detection"]["detected"] and r[mode]["detection"]["names_root_cause"])
        twins_clean = sum(1 for r in rows if not r[mode]["twin_violations"])
        lines += [f"### Detection with the {title}", "",
                  f"Detected within one step of onset: **{detected} / {len(rows)}**; top violation names the root "
                  f"cause in {named} of those; healthy twins with zero violations: {twins_clean} / {len(rows)}.", "",
                  "| bug | source | onset | detected (first violation − onset) | relation(s) | invariant(s) violated first | names root cause | twin violations |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            case = next(c for c in ALL_BUGS if c.id == r["id"])
            d = r[mode]["detection"]
            lines.append(
                f"| `{r['id']}` | {case.source} | {r['onset']} | {_detection_cell(d)} | {_cell(d['relations'])} | "
                f"{_cell(d['invariants'])} | {'yes' if d['names_root_cause'] else 'no'} | "
                f"{len(r[mode]['twin_violations'])} |")
        lines.append("")
    misses = [r for r in rows if not r["default"]["detection"]["detected"]]
    if misses:
        lines += ["Not caught by the default set, and why (details in `benchmarks/silent_bugs/GAPS.md`):", ""]
        for r in misses:
            case = next(c for c in ALL_BUGS if c.id == r["id"])
            lines.append(f"- `{r['id']}`: {case.gap or 'not analysed yet'}")
        lines.append("")
    twin_fp = FalsePositives()
    for r in rows:
        twin_fp.runs += 1
        twin_fp.invariants_checked += r["default"]["twin_checked"]
        twin_fp.invariants_violated += len(r["default"]["twin_violations"])
        twin_fp.runs_with_violation += bool(r["default"]["twin_violations"])
    total_runs = held_out["runs"] + twin_fp.runs
    dirty = held_out["runs_with_violation"] + twin_fp.runs_with_violation
    checked = held_out["checked"] + twin_fp.invariants_checked
    violated = held_out["violated"] + twin_fp.invariants_violated
    lines += ["### False positives of the default set on healthy runs", "",
              "| healthy runs | runs with any violation | runs with zero violations | violated / checked invariants |",
              "|---|---|---|---|",
              f"| {held_out['runs']} held-out reference runs (seed {build_default_set.HELD_OUT['seed']}, "
              f"{build_default_set.HELD_OUT['steps']} steps) | {held_out['runs_with_violation']} | "
              f"{held_out['runs'] - held_out['runs_with_violation']} / {held_out['runs']} | "
              f"{held_out['violated']} / {held_out['checked']} |",
              f"| {twin_fp.runs} healthy twins | {twin_fp.runs_with_violation} | "
              f"{twin_fp.runs - twin_fp.runs_with_violation} / {twin_fp.runs} | "
              f"{twin_fp.invariants_violated} / {twin_fp.invariants_checked} |",
              f"| **all {total_runs}** | {dirty} | **{(total_runs - dirty) / max(1, total_runs):.0%}** | "
              f"**{violated} / {checked} = {violated / max(1, checked):.2%}** |", ""]
    if held_out["offenders"]:
        lines += ["Held-out offenders: " + "; ".join(f"`{k}`: {_cell(v, 3)}" for k, v in held_out["offenders"].items()), ""]
    lines += [END]
    return "\n".join(lines) + "\n"


def write_results(section: str) -> None:
    text = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else "# Benchmark results\n"
    if BEGIN in text and END in text:
        head, _, rest = text.partition(BEGIN)
        _, _, tail = rest.partition(END)
        text = head + section.rstrip("\n") + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section
    RESULTS.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=build_default_set.DEFAULT_WORK)
    parser.add_argument("--jobs", type=int, default=1, help="bugs collected in parallel")
    parser.add_argument("--reuse", action="store_true", help="reuse traces already in --work")
    parser.add_argument("--no-build", action="store_true", help="keep the current default set")
    parser.add_argument("--set-output", type=Path, default=None,
                        help="write the curated set here and check with -i (default: the package data, no -i)")
    parser.add_argument("--only", nargs="*", default=None, metavar="ID", help="run only these bugs (no RESULTS.md)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    work: Path = args.work
    (work / "held-out").mkdir(parents=True, exist_ok=True)

    if args.no_build:  # traces of an older producer in --work are only reused when asked
        build_default_set.collect_references(work, "inference", jobs=args.jobs, reuse=args.reuse,
                                             **build_default_set.INFERENCE)
    else:
        build_default_set.build(work, args.set_output or build_default_set.DEFAULT_OUTPUT, args.jobs, args.reuse)
    curation = json.loads((work / "curation.json").read_text()) if (work / "curation.json").exists() else {}
    default_set = args.set_output  # None: the package data, exactly what users get without -i

    cases = [c for c in ALL_BUGS if args.only is None or c.id in args.only]

    def one(case: BugCase) -> dict:
        row = evaluate_bug(case, collect_bug_runs(case, work, args.reuse), work, default_set)
        d = row["default"]["detection"]
        print(f"{case.id:36s} default={_detection_cell(d):12s} inferred={_detection_cell(row['inferred']['detection']):12s}"
              f" twin_fp={len(row['default']['twin_violations'])} {'; '.join(d['relations'])}", flush=True)
        return row

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(one, cases))
    (work / "results.json").write_text(json.dumps(rows, indent=1, default=str) + "\n", encoding="utf-8")
    if args.only is not None:
        return 0
    held_out = held_out_false_positives(work, args.jobs, args.reuse, default_set)
    command = "python benchmarks/silent_bugs/run.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    section = render(rows, held_out, command.strip(), time.monotonic() - started, curation, args.reuse)
    write_results(section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
