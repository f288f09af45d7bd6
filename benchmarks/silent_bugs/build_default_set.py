"""Regenerate the shipped default invariant set from the healthy reference pipelines.

    python benchmarks/silent_bugs/build_default_set.py [--work DIR] [--jobs N] [--reuse] [--explain]
    python benchmarks/silent_bugs/build_default_set.py --audit FILE [--validate] [--reuse] [--explain]

1. collect every reference pipeline (``references.py``) twice: an *inference* run and a
   *validation* run with another seed and another length;
2. ``trainwatch infer`` over all inference runs gives the candidates, with their
   positive-example counts;
3. each reference is also inferred on its own, which says which pipelines support each
   candidate (same relation and parameters);
4. the evidence rules for shipping (``shipping_rules.py``) — an invariant enters the
   default set only if

   * at least 3 reference pipelines support it, of at least 3 different styles;
   * it has at least 30 positive examples over all references;
   * a constant it pins is pinned to the same value by every pipeline that pins it
     under the same precondition; output dtypes only under an active autocast;
     argument values only for the ``training`` flag (hyperparameters are not laws);

   and the core refuses, at inference, rules keyed on user classes, distinct-value rules
   about anything but seeds and RNG states, and argument values other than flags;
5. each candidate that meets the evidence rules is checked against every validation run
   — the references again, plus the core's synthetic healthy runs
   (``invariants/synthetic.py``) — and any invariant that fires on a healthy run is
   dropped: what survives holds across seeds, lengths and pipelines;
6. the survivors are written to ``invariants/data/default_invariants.json`` (the
   package data ``check``/``watch`` use without ``-i``), with a curation log
   (``curation.json`` in the work directory) giving, per refused invariant, every
   reason it was refused; ``--explain`` prints them.

``--audit FILE`` applies steps 3-4 (and 5 with ``--validate``) to an existing invariant
file instead of new candidates, and reports which of its invariants the rules keep.
The output is deterministic for the same traces (``trainwatch infer`` is, and the
filter only removes). Extend the set by adding a pipeline to ``references.py`` (and its
style to ``shipping_rules.STYLES``).
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import REPO, CollectResult, check, collect_with_traces, infer  # noqa: E402
from references import REFERENCES, Reference  # noqa: E402
from shipping_rules import (MIN_PIPELINES, MIN_POSITIVES, MIN_STYLES, evidence_reasons, pinned_values,  # noqa: E402
                            shape, style_of)

DEFAULT_WORK = Path(__file__).resolve().parent / ".work"
DEFAULT_OUTPUT = REPO / "invariants" / "data" / "default_invariants.json"
INFERENCE = {"seed": 0, "steps": 6}
VALIDATION = {"seed": 1, "steps": 9}
HELD_OUT = {"seed": 2, "steps": 7}


@dataclass
class Curation:
    candidates: int
    kept: list[dict]
    #: invariant id -> every reason it was refused (evidence rules, then the validation
    #: runs it fired on as ``fired on <run>``)
    dropped: dict[str, list[str]]
    validation_runs: list[str]
    #: invariant id -> its description, for the refused ones (the log is read by people)
    descriptions: dict[str, str] = field(default_factory=dict)

    def reason_counts(self) -> dict[str, int]:
        """How many refused invariants each kind of reason refused (one may have several)."""
        counts: dict[str, int] = {}
        for reasons in self.dropped.values():
            for kind in sorted({reason_kind(r) for r in reasons}):
                counts[kind] = counts.get(kind, 0) + 1
        return counts

    def log(self) -> dict[str, Any]:
        return {
            "candidates": self.candidates,
            "kept": len(self.kept),
            "dropped": self.dropped,
            "dropped_descriptions": self.descriptions,
            "reason_counts": self.reason_counts(),
            "validation_runs": self.validation_runs,
            "rules": {"min_pipelines": MIN_PIPELINES, "min_styles": MIN_STYLES, "min_positives": MIN_POSITIVES},
        }


def reason_kind(reason: str) -> str:
    """The rule a reason names: the words before its first digit or colon."""
    if reason.startswith("fired on "):
        return "fired on a healthy validation run"
    head = reason.split(":", 1)[0]
    return head.rstrip("0123456789<> ").strip() or head


SYNTHETIC_HEALTHY = (
    {"world": 1, "steps": 8, "seed": 11, "autocast": False},
    {"world": 2, "steps": 8, "seed": 12, "autocast": True},
    {"world": 3, "steps": 7, "seed": 13, "autocast": False},
)


def write_synthetic_healthy(work: Path) -> dict[str, CollectResult]:
    """The core's synthetic healthy runs, as trace dirs `trainwatch check` can read."""
    from invariants.synthetic import SyntheticRun
    from trainwatch.tracedir import write_trace_dir

    results = {}
    for index, config in enumerate(SYNTHETIC_HEALTHY):
        name = f"synthetic-{index}"
        trace_dir = work / "references" / "synthetic" / name
        write_trace_dir(trace_dir, SyntheticRun(run=name, **config).batches(), prefix=f"{name}-")
        results[name] = CollectResult(trace_dir, 0, 0.0, "synthetic")
    return results


def pipeline_support(inference: dict[str, CollectResult], work: Path) -> tuple[dict[str, set[str]], dict[str, list]]:
    """Each reference inferred alone: for each invariant shape, the pipelines that yield
    it, and each pipeline's own invariants (for the constants rule)."""
    support: dict[str, set[str]] = {}
    per_pipeline: dict[str, list] = {}
    for ref_id, result in sorted(inference.items()):
        alone = work / "per-pipeline" / f"{ref_id}.json"
        alone.parent.mkdir(parents=True, exist_ok=True)
        infer([result.trace_dir], alone)
        per_pipeline[ref_id] = json.loads(alone.read_text(encoding="utf-8"))["invariants"]
        for invariant in per_pipeline[ref_id]:
            support.setdefault(shape(invariant), set()).add(ref_id)
    return support, per_pipeline


def collect_references(work: Path, phase: str, seed: int, steps: int, jobs: int, reuse: bool,
                       references: tuple[Reference, ...] = REFERENCES) -> dict[str, CollectResult]:
    """Collect each reference once for a phase; ``reuse`` keeps an existing non-empty trace dir."""

    def one(ref: Reference) -> tuple[str, CollectResult]:
        trace_dir = work / "references" / phase / ref.id
        if reuse and trace_dir.is_dir() and any(trace_dir.glob("*.twtrace")):
            return ref.id, CollectResult(trace_dir, 0, 0.0, "reused")
        return ref.id, collect_with_traces(ref.command(seed=seed, steps=steps), trace_dir, f"{ref.id}-{phase}")

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return dict(pool.map(one, references))


def curate(candidates_path: Path, validation: dict[str, CollectResult] | None, work: Path,
           support: dict[str, set[str]], per_pipeline: dict[str, list]) -> Curation:
    """Apply the evidence rules to every candidate, then validate those that meet them
    (``validation`` None: evidence rules only, as ``--audit`` without ``--validate``)."""
    document = json.loads(candidates_path.read_text(encoding="utf-8"))
    pins = pinned_values(per_pipeline)
    refused: dict[str, list[str]] = {}
    for invariant in document["invariants"]:
        reasons = evidence_reasons(invariant, support, pins, {ref.id: style_of(ref) for ref in REFERENCES})
        if reasons:
            refused[invariant["id"]] = reasons
    if validation:
        broad = {"format": document["format"], "version": document["version"],
                 "invariants": [inv for inv in document["invariants"] if inv["id"] not in refused]}
        broad_path = work / "candidates-broad.json"
        broad_path.write_text(json.dumps(broad, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        for ref_id, result in sorted(validation.items()):
            outcome = check(result.trace_dir, work / "curation" / f"{ref_id}.json", invariants=broad_path)
            if outcome.exit_code not in (0, 1):
                raise RuntimeError(f"check of validation run {ref_id} failed: {outcome.error}")
            for invariant_id in outcome.violated_invariants:
                refused.setdefault(invariant_id, []).append(f"fired on {ref_id}")
    kept = [inv for inv in document["invariants"] if inv["id"] not in refused]
    descriptions = {inv["id"]: inv.get("description", "") for inv in document["invariants"] if inv["id"] in refused}
    return Curation(len(document["invariants"]), kept, refused, sorted(validation or ()), descriptions)


#: APIs whose events come from helper processes (DataLoader workers), not the training thread.
HELPER_PROCESS_APIS = frozenset({"torch.utils.data.worker_init"})


def without_helper_context_guard(invariant: dict) -> dict:
    """A worker's autocast/grad context says nothing about the training step, so a guard
    on it only hides worker events that lack it; the id follows the content."""
    if not set(invariant.get("apis", ())) <= HELPER_PROCESS_APIS or not invariant.get("precondition"):
        return invariant
    fields = {clause.get("field", "") for conjunct in invariant["precondition"].get("any", [])
              for clause in conjunct.get("all", [])}
    if not all(field.startswith("ctx.") for field in fields):
        return invariant
    return {k: v for k, v in invariant.items() if k != "id"} | {"precondition": None}


def write_set(kept: list[dict], output: Path) -> None:
    from invariants.invariant_file import dumps, loads

    kept = [without_helper_context_guard(inv) for inv in kept]
    invariants = loads({"format": "trainwatch-invariants", "version": 1, "invariants": kept}, "curated set")
    output.write_text(dumps(invariants), encoding="utf-8")


def build(work: Path, output: Path, jobs: int, reuse: bool) -> Curation:
    (work / "curation").mkdir(parents=True, exist_ok=True)
    inference = collect_references(work, "inference", jobs=jobs, reuse=reuse, **INFERENCE)
    validation = collect_references(work, "validation", jobs=jobs, reuse=reuse, **VALIDATION)
    candidates = work / "candidates.json"
    infer([inference[ref.id].trace_dir for ref in REFERENCES], candidates)
    validation.update(write_synthetic_healthy(work))
    curation = curate(candidates, validation, work, *pipeline_support(inference, work))
    write_set(curation.kept, output)
    log = curation.log() | {"references": {ref.id: style_of(ref) for ref in REFERENCES},
                            "inference": INFERENCE, "validation": VALIDATION}
    (work / "curation.json").write_text(json.dumps(log, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return curation


def audit(invariants_path: Path, work: Path, jobs: int, reuse: bool, validate: bool) -> Curation:
    """The evidence rules (and with ``validate`` the validation runs) applied to an
    existing invariant file; the support comes from the references' inference runs."""
    (work / "curation").mkdir(parents=True, exist_ok=True)
    inference = collect_references(work, "inference", jobs=jobs, reuse=reuse, **INFERENCE)
    validation = None
    if validate:
        validation = collect_references(work, "validation", jobs=jobs, reuse=reuse, **VALIDATION)
        validation.update(write_synthetic_healthy(work))
    curation = curate(invariants_path, validation, work, *pipeline_support(inference, work))
    log = curation.log() | {"audited": str(invariants_path)}
    (work / "audit.json").write_text(json.dumps(log, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return curation


def explain(curation: Curation) -> str:
    """One block per refused invariant: what it says and every reason it was refused."""
    lines = []
    for invariant_id in sorted(curation.dropped):
        lines.append(f"{invariant_id}  {curation.descriptions.get(invariant_id, '')}")
        lines.extend(f"    - {reason}" for reason in curation.dropped[invariant_id])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK, help="where traces and reports go")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="curated invariant file to write")
    parser.add_argument("--jobs", type=int, default=1, help="training runs collected in parallel")
    parser.add_argument("--reuse", action="store_true", help="reuse reference traces already in --work")
    parser.add_argument("--audit", type=Path, help="judge this invariant file by the shipping rules; write nothing")
    parser.add_argument("--validate", action="store_true", help="with --audit: also check the validation runs")
    parser.add_argument("--explain", action="store_true", help="print why each refused invariant was refused")
    args = parser.parse_args(argv)
    if args.audit is not None:
        if not args.audit.is_file():
            print(f"error: no invariant file at {args.audit}", file=sys.stderr)
            return 2
        curation = audit(args.audit, args.work, args.jobs, args.reuse, args.validate)
        verdict = f"audit of {args.audit}: {len(curation.kept)} of {curation.candidates} meet the shipping rules"
    else:
        curation = build(args.work, args.output, args.jobs, args.reuse)
        verdict = f"default set: kept {len(curation.kept)} of {curation.candidates} candidates -> {args.output}"
    if args.explain:
        print(explain(curation))
    counts = ", ".join(f"{kind}: {n}" for kind, n in sorted(curation.reason_counts().items()))
    print(f"{verdict}; refused {len(curation.dropped)} ({counts or 'none'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
