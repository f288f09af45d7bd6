"""Programs written apart from the reference corpus, run zero-config as a user would.

    python benchmarks/outside/run.py [--suite bugs_a|...|bugs_n|healthy_a|...|healthy_n ...]
                                     [--only NAME ...] [--work DIR] [--jobs N] [--write-results]

Twenty-eight suites of small training programs, each modelled on a named public program or bug
report (their docstrings say which), written without looking at the references or the
silent-bug benchmark:

* ``bugs_a`` to ``bugs_n``: a bug that starts partway (the program prints
  ``ONSET step K`` at its first buggy optimizer step, 0-based) and a healthy twin
  (``--healthy``);
* ``healthy_a`` to ``healthy_n``: healthy programs in styles and
  frameworks the references do not use.

Each batch was written after what the previous one showed had been fixed, so the
latest batch (``_n``) is the out-of-sample figure; the earlier ones are in sample.
Each program runs under ``trainwatch collect`` (two gloo ranks where it sets up
``torch.distributed``) and is judged by ``trainwatch check`` with the shipped default
set.  A bug counts as caught when a violation falls in its onset window (K + 1: window
0 is setup) or the next one, and as a false alarm when it is reported earlier.  Windows
are training iterations, so a program with two optimizers stepping once each per
iteration prints ``ONSET iteration I`` (0-based) instead of counting optimizer steps.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SUITES = ("bugs_a", "bugs_b", "bugs_c", "bugs_d", "bugs_e", "bugs_f", "bugs_g", "bugs_h", "bugs_i", "bugs_j", "bugs_k",
          "bugs_l", "bugs_m", "bugs_n",
          "healthy_a", "healthy_b", "healthy_c", "healthy_d", "healthy_e", "healthy_f", "healthy_g", "healthy_h",
          "healthy_i", "healthy_j", "healthy_k", "healthy_l", "healthy_m", "healthy_n")
TRAINWATCH = (sys.executable, "-m", "trainwatch.cli")
ONSET = re.compile(r"ONSET.*?(?:step|iteration) (\d+)")
TIMEOUT_S = 600
RESULTS_FILE = REPO / "benchmarks" / "RESULTS.md"
BEGIN, END = "<!-- outside:begin -->", "<!-- outside:end -->"


@dataclass
class Verdict:
    """One run's check: the windows with violations, and what fired first."""

    ran: bool
    windows: list[int]
    first: str
    iterations: str

    @property
    def clean(self) -> bool:
        return self.ran and not self.windows


def _is_distributed(program: Path) -> bool:
    source = program.read_text()
    return "init_process_group" in source or "LOCAL_RANK" in source or bool({"ddp", "dist"} & set(program.stem.split("_")))


def _run(program: Path, work: Path, *flags: str) -> tuple[Verdict, int | None]:
    trace = work / "trace"
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
                if _is_distributed(program) else [sys.executable])
    collected = subprocess.run([*TRAINWATCH, "collect", "-o", str(trace), "--", *launcher, str(program), *flags],
                               cwd=work, capture_output=True, text=True, timeout=TIMEOUT_S)
    onset = ONSET.search(collected.stdout + collected.stderr)
    report = work / "report.json"
    checked = subprocess.run([*TRAINWATCH, "check", str(trace), "--report-json", str(report)],
                             cwd=work, capture_output=True, text=True, timeout=TIMEOUT_S)
    if checked.returncode not in (0, 1) or not report.exists():
        return Verdict(False, [], (checked.stdout + checked.stderr).strip().splitlines()[-1:][0] if
                       (checked.stdout + checked.stderr).strip() else "check failed", ""), None
    violations = json.loads(report.read_text()).get("violations", [])
    windows = sorted({v["step"] for v in violations})
    first = min(violations, key=lambda v: v["step"])["description"] if violations else ""
    coverage = next((line.strip() for line in checked.stdout.splitlines() if "iterations" in line), "")
    return Verdict(True, windows, first, coverage), (int(onset.group(1)) + 1 if onset else None)


def run_bug(program: Path, work: Path) -> dict:
    bug, onset = _run(program, work / "bug")
    twin, _ = _run(program, work / "healthy", "--healthy")
    caught = onset is not None and any(onset <= w <= onset + 1 for w in bug.windows)
    early = onset is not None and any(w < onset for w in bug.windows)
    return {"name": program.stem, "onset": onset, "caught": caught, "early": early,
            "bug_windows": bug.windows[:6], "fired": bug.first, "twin_clean": twin.clean, "twin_fired": twin.first}


def run_healthy(program: Path, work: Path) -> dict:
    verdict, _ = _run(program, work)
    return {"name": program.stem, "clean": verdict.clean, "ran": verdict.ran, "windows": verdict.windows[:6],
            "fired": verdict.first}


def table(suite: str, rows: list[dict]) -> str:
    if suite.startswith("bugs"):
        caught = sum(r["caught"] and not r["early"] for r in rows)
        twins = sum(r["twin_clean"] for r in rows)
        lines = [f"**{suite}**: caught within one step of onset {caught} / {len(rows)}; healthy twins clean "
                 f"{twins} / {len(rows)}", "", "| program | onset window | caught | first violation | twin clean |",
                 "|---|---|---|---|---|"]
        lines += [f"| `{r['name']}` | {r['onset']} | {'**yes**' if r['caught'] and not r['early'] else 'no'} "
                  f"| {r['fired'] or '—'} | {'yes' if r['twin_clean'] else 'no: ' + r['twin_fired']} |" for r in rows]
    else:
        clean = sum(r["clean"] for r in rows)
        lines = [f"**{suite}**: clean {clean} / {len(rows)}", "", "| program | clean | first violation |",
                 "|---|---|---|"]
        lines += [f"| `{r['name']}` | {'yes' if r['clean'] else 'no'} | {r['fired'] or '—'} |" for r in rows]
    return "\n".join(lines)


def write_results(text: str, command: str) -> None:
    block = f"{BEGIN}\n## Programs written apart from the corpus (`benchmarks/outside/run.py`)\n\nCommand: `{command}`\n\n{text}\n{END}"
    current = RESULTS_FILE.read_text()
    if BEGIN in current:
        head, rest = current.split(BEGIN, 1)
        current = head + block + rest.split(END, 1)[1]
    else:
        current = current.rstrip("\n") + "\n\n" + block + "\n"
    RESULTS_FILE.write_text(current)


def _run_program(suite: str, program: Path, work: Path) -> dict:
    target = work / suite / program.stem
    shutil.rmtree(target, ignore_errors=True)
    (target / "bug").mkdir(parents=True)
    (target / "healthy").mkdir(parents=True)
    row = run_bug(program, target) if suite.startswith("bugs") else run_healthy(program, target)
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", action="append", choices=SUITES, help="suites to run (default: all)")
    parser.add_argument("--only", nargs="+", help="program names (stems) to run")
    parser.add_argument("--work", type=Path, help="where traces go (default: a temporary directory)")
    parser.add_argument("--jobs", type=int, default=1, help="programs run at once (a distributed one takes 2 cores)")
    parser.add_argument("--write-results", action="store_true", help="replace the block in benchmarks/RESULTS.md")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="tw-outside-"))
    sections = []
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for suite in args.suite or SUITES:
            programs = [p for p in sorted((HERE / suite).glob("*.py")) if not args.only or p.stem in args.only]
            rows = list(pool.map(lambda program, suite=suite: _run_program(suite, program, work), programs))
            sections.append(table(suite, rows))
    text = "\n\n".join(sections)
    print(text)
    if args.write_results:
        write_results(text, "python benchmarks/outside/run.py " + " ".join(sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
