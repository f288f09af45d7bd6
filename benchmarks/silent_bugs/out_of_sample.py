"""Out-of-sample figures for the default set: leave-one-pipeline-out and
leave-one-bug-class-out, next to the in-sample ones.

    python benchmarks/silent_bugs/out_of_sample.py [--work DIR] [--jobs 2] [--write-results]

The shipped set is judged on programs its build saw (the references' held-out runs) and
on bug reproductions written beside it.  Those figures flatter it; what users get is
its behaviour on programs nobody wrote for it.  Both figures here rebuild the set with
the build's own steps (``build_default_set``: infer, evidence rules, validation) from a
*subset* of the references and check what was left out:

* **leave-one-pipeline-out (false alarms)**: for each reference P, the set built from
  every other reference checks P's held-out run (seed and length used by no build);
* **leave-one-bug-class-out (detection)**: for each root-cause class, the set built
  without the references of the styles its reproductions are written in (a GAN bug
  without GAN references, a DDP bug without DDP references) checks every reproduction
  of the class and its healthy twin.

It reads a work directory where ``run.py`` ran (reference traces, held-out runs, bug
runs, per-pipeline inferences) and collects nothing: traces are decoded once, and each
(validation run, invariant) pair is checked once over all folds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import build_default_set  # noqa: E402
from harness import REPO, check  # noqa: E402
from invariants.engine import Engine  # noqa: E402
from invariants.step_windows import StepWindows
from invariants.inference import Inferencer  # noqa: E402
from invariants.invariant_file import dumps, load_set  # noqa: E402
from invariants.wire import wire_types  # noqa: E402
from trainwatch.tracedir import read_trace_dir  # noqa: E402
from references import REFERENCES, Reference  # noqa: E402
from registry import ALL_BUGS, BugCase, onset_step  # noqa: E402
from scoring import score  # noqa: E402
from shipping_rules import evidence_reasons, pinned_values, shape, style_of  # noqa: E402

RESULTS = REPO / "benchmarks" / "RESULTS.md"
BEGIN, END = "<!-- out-of-sample:begin -->", "<!-- out-of-sample:end -->"


#: The reference style each reproduction's program is written in (a bug not listed is an
#: MLP-style single-process loop).  Leave-one-bug-class-out removes the references of
#: these styles: a class must be caught without references written like its programs.
PROGRAM_STYLE: dict[str, str] = {
    "ddp_raw_module": "ddp-torchrun", "ddp_lost_sync_hooks": "ddp-torchrun", "compiled_ddp_drift": "ddp-torchrun",
    "lr_diverges_across_ranks": "ddp-torchrun", "distributed_sampler_no_set_epoch": "ddp-torchrun",
    "bf16_clip_one_rank": "manual-data-parallel", "allreduce_corruption": "manual-data-parallel",
    "moe_inconsistent_collective_args": "manual-data-parallel", "ranks_init_unsynced": "manual-data-parallel",
    "generate_ignores_max_new_tokens": "rnn", "two_optimizers_one_forgotten": "rnn",
    "reinit_every_step": "transformer-lm", "tied_weights_untied": "transformer-lm", "reinit_after_load": "transformer-lm",
    "eval_dropout_attention": "transformer-lm",
    "freeze_only_in_train": "cnn", "preprocess_batch_size": "cnn",
    "spectral_norm_eval_first": "gan", "gan_module_zero_grad": "gan",
    "dataloader_same_augmentation": "dataloader-workers", "dataloader_only_same_rng": "dataloader-workers",
    "autocast_skipped": "mixed-precision", "amp_clip_scaled_grads": "mixed-precision",
}


def program_style(case: BugCase) -> str:
    return PROGRAM_STYLE.get(case.id, "mlp")


@dataclass
class PipelineOutcome:
    reference: str
    style: str
    in_sample_violations: int
    out_of_sample_violations: int
    out_of_sample_invariants: list[str]


@dataclass
class BugOutcome:
    bug: str
    cause_class: str
    left_out_styles: list[str]
    in_sample: bool
    out_of_sample: bool
    twin_clean_out_of_sample: bool


class FoldBuilder:
    """Rebuilds the default set from a subset of the references, in this process.

    Each fold repeats the build's steps (inference, evidence rules, validation) on the
    traces the full build collected.  Traces are decoded once and kept; whether an
    invariant fires on a validation run depends only on the two, so each (run,
    invariant) pair is checked once over all folds — most candidates of a fold are the
    full build's own."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self._batches: dict[Path, list] = {}
        self._fired: dict[str, dict[str, bool]] = {}  # validation run -> invariant id -> fired
        self._lock = threading.Lock()
        self._synthetic = {name: result.trace_dir
                           for name, result in build_default_set.write_synthetic_healthy(work).items()}

    def batches(self, trace_dir: Path) -> list:
        with self._lock:
            if trace_dir not in self._batches:
                self._batches[trace_dir] = list(read_trace_dir(trace_dir, decode=wire_types(None).decode))
            return self._batches[trace_dir]

    def fold_set(self, left_out: set[str]) -> Path:
        """The default set rebuilt without the references ``left_out`` (cached by content)."""
        key = hashlib.sha256(json.dumps(sorted(left_out)).encode()).hexdigest()[:12]
        fold = self.work / "out-of-sample" / key
        output = fold / "set.json"
        if output.exists():
            return output
        fold.mkdir(parents=True, exist_ok=True)
        (fold / "left_out.json").write_text(json.dumps(sorted(left_out)) + "\n", encoding="utf-8")
        kept_refs = [ref for ref in REFERENCES if ref.id not in left_out]
        inferencer = Inferencer()
        for ref in kept_refs:
            inferencer.add_trace(iter(self.batches(_reference_dir(self.work, "inference", ref))))
        candidates = json.loads(dumps(inferencer.finish()))["invariants"]
        support, per_pipeline = _support(self.work, kept_refs)
        pins = pinned_values(per_pipeline)
        styles = {ref.id: style_of(ref) for ref in REFERENCES}
        broad = [inv for inv in candidates if not evidence_reasons(inv, support, pins, styles)]
        runs = {ref.id: _reference_dir(self.work, "validation", ref) for ref in kept_refs}
        runs.update(self._synthetic)
        fired = set()
        for name, trace_dir in sorted(runs.items()):
            fired |= self._fired_on(name, trace_dir, broad)
        build_default_set.write_set([inv for inv in broad if inv["id"] not in fired], output)
        return output

    def _fired_on(self, run: str, trace_dir: Path, invariants: list[dict]) -> set[str]:
        with self._lock:
            known = dict(self._fired.setdefault(run, {}))
        unknown = [inv for inv in invariants if inv["id"] not in known]
        if unknown:
            invariant_set = load_set({"format": "trainwatch-invariants", "version": 1, "invariants": unknown}, run)
            windows = StepWindows.replay(Engine(invariant_set))
            violated: set[str] = set()
            for batch in self.batches(trace_dir):
                violated.update(v.invariant for v in windows.feed(batch))
            violated.update(v.invariant for v in windows.finish())
            verdicts = {inv["id"]: inv["id"] in violated for inv in unknown}
            with self._lock:
                self._fired[run].update(verdicts)
            known.update(verdicts)
        return {inv["id"] for inv in invariants if known[inv["id"]]}


def _reference_dir(work: Path, phase: str, ref: Reference) -> Path:
    trace_dir = work / "references" / phase / ref.id
    if not any(trace_dir.glob("*.twtrace")):
        raise RuntimeError(f"no {phase} trace of {ref.id} in {trace_dir}: run run.py with this --work first")
    return trace_dir


def _support(work: Path, refs: list[Reference]) -> tuple[dict[str, set[str]], dict[str, list]]:
    """Per-pipeline inferences of the full build, restricted to ``refs``."""
    support: dict[str, set[str]] = {}
    per_pipeline: dict[str, list] = {}
    for ref in refs:
        path = work / "per-pipeline" / f"{ref.id}.json"
        per_pipeline[ref.id] = json.loads(path.read_text(encoding="utf-8"))["invariants"]
        for invariant in per_pipeline[ref.id]:
            support.setdefault(shape(invariant), set()).add(ref.id)
    return support, per_pipeline


def _violations(trace_dir: Path, report: Path, invariants: Path | None) -> list[dict]:
    outcome = check(trace_dir, report, invariants)
    # exit 2 with a report: a run that never trains, its setup window checked
    if outcome.exit_code not in (0, 1) and not (outcome.exit_code == 2 and outcome.report.get("summary")):
        raise RuntimeError(f"check of {trace_dir} failed ({outcome.exit_code}): {outcome.error}")
    return outcome.violations


def leave_one_pipeline_out(builder: FoldBuilder, full_set: Path | None, jobs: int) -> list[PipelineOutcome]:
    work = builder.work

    def one(ref: Reference) -> PipelineOutcome:
        held_out = work / "references" / "held-out" / ref.id
        fold = builder.fold_set({ref.id})
        reports = work / "out-of-sample" / "reports"
        reports.mkdir(parents=True, exist_ok=True)
        inside = _violations(held_out, reports / f"{ref.id}.in.json", full_set)
        outside = _violations(held_out, reports / f"{ref.id}.lopo.json", fold)
        return PipelineOutcome(ref.id, style_of(ref), len(inside), len(outside),
                               sorted({v.get("description", v.get("invariant", "?")) for v in outside}))

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, REFERENCES))


def leave_one_bug_class_out(builder: FoldBuilder, full_set: Path | None, jobs: int) -> list[BugOutcome]:
    work = builder.work
    classes: dict[str, list[BugCase]] = {}
    for case in ALL_BUGS:
        classes.setdefault(case.cause_class or case.id, []).append(case)

    def one(item: tuple[str, list[BugCase]]) -> list[BugOutcome]:
        cause, cases = item
        styles = sorted({program_style(case) for case in cases})
        left_out = {ref.id for ref in REFERENCES if style_of(ref) in styles}
        fold = builder.fold_set(left_out) if left_out else full_set
        outcomes = []
        for case in cases:
            runs = work / "bugs" / case.id
            if not (runs / "bug").is_dir():
                continue
            reports = work / "out-of-sample" / "reports"
            reports.mkdir(parents=True, exist_ok=True)
            onset = onset_step(case.onset, in_setup=case.in_setup, setup_window=True)
            verdicts = []
            for label, invariants in (("in", full_set), ("lobco", fold)):
                bug = _violations(runs / "bug", reports / f"{case.id}.{label}.bug.json", invariants)
                twin = _violations(runs / "twin", reports / f"{case.id}.{label}.twin.json", invariants)
                verdicts.append((score(bug, onset, case.root_cause, twin).detected, not twin))
            outcomes.append(BugOutcome(case.id, cause, styles, verdicts[0][0], verdicts[1][0], verdicts[1][1]))
        return outcomes

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return [outcome for group in pool.map(one, sorted(classes.items())) for outcome in group]


def render(pipelines: list[PipelineOutcome], bugs: list[BugOutcome], command: str, minutes: float) -> str:
    clean_in = sum(p.in_sample_violations == 0 for p in pipelines)
    clean_out = sum(p.out_of_sample_violations == 0 for p in pipelines)
    caught_in = sum(b.in_sample for b in bugs)
    caught_out = sum(b.out_of_sample for b in bugs)
    classes = sorted({b.cause_class for b in bugs})
    lines = [BEGIN, "## Out-of-sample figures (`benchmarks/silent_bugs/out_of_sample.py`)", "",
             f"Command: `{command}` — {minutes:.1f} min (reuses the traces of `run.py`).", "",
             "| measure | in sample (shipped set) | out of sample (set rebuilt without) |", "|---|---|---|",
             f"| reference held-out runs with zero violations (leave-one-pipeline-out) | {clean_in} / {len(pipelines)} "
             f"| {clean_out} / {len(pipelines)} |",
             f"| bugs caught within one step (leave-one-bug-class-out, {len(classes)} classes) | {caught_in} / {len(bugs)} "
             f"| {caught_out} / {len(bugs)} |",
             f"| healthy twins clean under the class's fold | — | {sum(b.twin_clean_out_of_sample for b in bugs)} / {len(bugs)} |",
             ""]
    flagged = [p for p in pipelines if p.out_of_sample_violations]
    if flagged:
        lines += ["Pipelines a set built without them flags (what such a program written by a stranger would see):", ""]
        lines += [f"- `{p.reference}` ({p.style}): " + "; ".join(p.out_of_sample_invariants[:3]) for p in flagged]
        lines.append("")
    lost = [b for b in bugs if b.in_sample and not b.out_of_sample]
    if lost:
        lines += ["Caught in sample, missed without the references of their own styles:", ""]
        lines += [f"- `{b.bug}` ({b.cause_class}; left out: {', '.join(b.left_out_styles) or 'nothing'})" for b in lost]
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def write_results(section: str) -> None:
    text = RESULTS.read_text(encoding="utf-8")
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + section + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    RESULTS.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=build_default_set.DEFAULT_WORK)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--set", type=Path, default=None, help="the in-sample set (default: the shipped one)")
    parser.add_argument("--write-results", action="store_true", help="write the section into RESULTS.md")
    args = parser.parse_args(argv)
    started = time.monotonic()
    builder = FoldBuilder(args.work)
    pipelines = leave_one_pipeline_out(builder, args.set, args.jobs)
    bugs = leave_one_bug_class_out(builder, args.set, args.jobs)
    (args.work / "out-of-sample" / "results.json").write_text(
        json.dumps({"pipelines": [asdict(p) for p in pipelines], "bugs": [asdict(b) for b in bugs]}, indent=1) + "\n",
        encoding="utf-8")
    command = "python benchmarks/silent_bugs/out_of_sample.py " + " ".join(argv if argv is not None else sys.argv[1:])
    section = render(pipelines, bugs, command.strip(), (time.monotonic() - started) / 60)
    print(section)
    if args.write_results:
        write_results(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
