"""Regenerate the shipped default invariant set from the healthy reference pipelines.

    python benchmarks/silent_bugs/build_default_set.py [--work DIR] [--jobs N] [--reuse]

1. collect every reference pipeline (``references.py``) twice: an *inference* run and a
   *validation* run with another seed and another length;
2. ``trainwatch infer`` over all inference runs gives the candidates;
3. pipeline-specific candidates must be confirmed by several pipelines: each reference
   is also inferred on its own, and a rule about a user-defined module class or about
   call order (``APISequence``) is kept only if it is found (same relation and
   parameters) in at least ``MIN_SUPPORT`` different pipelines — one model's class
   names or one script's call order do not transfer. Rules about torch's own APIs and
   module types need one pipeline that exercises them (DataLoader workers, autocast);
   Rules pinning an output dtype to a constant are kept only under an active autocast
   (fp32 everywhere in the references says nothing about a user's fp16/bf16 model), and
   "module M calls F with argument a=v" keeps only ``training`` (``p=0.1`` or
   ``inplace=False`` are one author's configuration, not behaviour);
4. each remaining candidate is checked against every validation run — the references
   again, plus the core's synthetic healthy runs (``invariants/synthetic.py``, which the
   core's own tests treat as healthy) — and any invariant that fires on a healthy run is
   dropped: what survives holds across seeds, lengths and pipelines;
5. the survivors are written to ``invariants/data/default_invariants.json`` (the
   package data ``check``/``watch`` use without ``-i``), with a curation log next to the
   work directory.

The output is deterministic for the same traces (``trainwatch infer`` is, and the
filter only removes). Extend the set by adding a pipeline to ``references.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import REPO, CollectResult, check, collect, infer  # noqa: E402
from references import REFERENCES, Reference  # noqa: E402

DEFAULT_WORK = Path(__file__).resolve().parent / ".work"
DEFAULT_OUTPUT = REPO / "invariants" / "data" / "default_invariants.json"
INFERENCE = {"seed": 0, "steps": 6}
VALIDATION = {"seed": 1, "steps": 9}
HELD_OUT = {"seed": 2, "steps": 7}
MIN_SUPPORT = 2


@dataclass
class Curation:
    candidates: int
    kept: list[dict]
    dropped: dict[str, list[str]]  # invariant id -> why: validation runs it fired on, or "support:N"
    validation_runs: list[str]
    single_pipeline: int = 0


def _shape(invariant: dict) -> str:
    """What an invariant says, regardless of the precondition inferred for it."""
    return json.dumps([invariant["relation"], invariant["params"]], sort_keys=True)


def _requires_active_autocast(precondition: dict | None) -> bool:
    """True when every disjunct of a (non-negated) precondition pins ``ctx.autocast`` to a dtype."""
    if not precondition or precondition.get("negated"):
        return False
    return all(
        any(clause.get("field") == "ctx.autocast" and clause.get("kind") == "constant"
            and None not in clause.get("values", [None]) for clause in conjunct.get("all", []))
        for conjunct in precondition.get("any", [])
    )


def is_dtype_artefact(invariant: dict) -> bool:
    params = invariant["params"]
    return (invariant["relation"] == "APIOutput" and params.get("form") == "constant"
            and params.get("prop") == "dtype" and not _requires_active_autocast(invariant.get("precondition")))


def is_pipeline_specific(invariant: dict) -> bool:
    """Call order, or a module class the user wrote (not one of ``torch.nn``'s)."""
    import torch.nn

    if invariant["relation"] == "APISequence":
        return True
    mtype = invariant["params"].get("mtype")
    return bool(mtype) and not isinstance(getattr(torch.nn, mtype, None), type)


def is_configuration_pin(invariant: dict) -> bool:
    params = invariant["params"]
    return (invariant["relation"] == "EventContain" and params.get("form") == "call"
            and bool(set(params.get("args") or {}) - {"training"}))


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


def pipeline_support(inference: dict[str, CollectResult], work: Path) -> dict[str, set[str]]:
    """For each invariant shape, the reference pipelines that yield it when inferred alone."""
    support: dict[str, set[str]] = {}
    for ref_id, result in sorted(inference.items()):
        alone = work / "per-pipeline" / f"{ref_id}.json"
        alone.parent.mkdir(parents=True, exist_ok=True)
        infer([result.trace_dir], alone)
        for invariant in json.loads(alone.read_text(encoding="utf-8"))["invariants"]:
            support.setdefault(_shape(invariant), set()).add(ref_id)
    return support


def collect_references(work: Path, phase: str, seed: int, steps: int, jobs: int, reuse: bool,
                       references: tuple[Reference, ...] = REFERENCES) -> dict[str, CollectResult]:
    """Collect each reference once for a phase; ``reuse`` keeps an existing non-empty trace dir."""

    def one(ref: Reference) -> tuple[str, CollectResult]:
        trace_dir = work / "references" / phase / ref.id
        if reuse and trace_dir.is_dir() and any(trace_dir.glob("*.twtrace")):
            return ref.id, CollectResult(trace_dir, 0, 0.0, "reused")
        result = collect(ref.command(seed=seed, steps=steps), trace_dir, run_id=f"{ref.id}-{phase}")
        return ref.id, result

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = dict(pool.map(one, references))
    for ref_id, result in results.items():
        if result.returncode != 0:
            raise RuntimeError(f"reference {ref_id} ({phase}) exited {result.returncode}:\n{result.output_tail}")
    return results


def curate(candidates_path: Path, validation: dict[str, CollectResult], work: Path,
           support: dict[str, set[str]]) -> Curation:
    document = json.loads(candidates_path.read_text(encoding="utf-8"))
    fired: dict[str, list[str]] = {}
    narrow = 0
    for invariant in document["invariants"]:
        count = len(support.get(_shape(invariant), ()))
        if count < (MIN_SUPPORT if is_pipeline_specific(invariant) else 1):
            fired[invariant["id"]] = [f"support:{count}"]
            narrow += 1
        elif is_dtype_artefact(invariant):
            fired[invariant["id"]] = ["dtype-artefact"]
        elif is_configuration_pin(invariant):
            fired[invariant["id"]] = ["configuration-pin"]
    broad = {"format": document["format"], "version": document["version"],
             "invariants": [inv for inv in document["invariants"] if inv["id"] not in fired]}
    broad_path = work / "candidates-broad.json"
    broad_path.write_text(json.dumps(broad, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    for ref_id, result in sorted(validation.items()):
        outcome = check(result.trace_dir, work / "curation" / f"{ref_id}.json", invariants=broad_path)
        if outcome.exit_code not in (0, 1):
            raise RuntimeError(f"check of validation run {ref_id} failed: {outcome.error}")
        for invariant_id in outcome.violated_invariants:
            fired.setdefault(invariant_id, []).append(ref_id)
    kept = [inv for inv in document["invariants"] if inv["id"] not in fired]
    return Curation(len(document["invariants"]), kept, fired, sorted(validation), narrow)


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
    curation = curate(candidates, validation, work, pipeline_support(inference, work))
    write_set(curation.kept, output)
    log = {
        "candidates": curation.candidates,
        "kept": len(curation.kept),
        "dropped": curation.dropped,
        "single_pipeline": curation.single_pipeline,
        "min_support": MIN_SUPPORT,
        "references": [ref.id for ref in REFERENCES],
        "inference": INFERENCE,
        "validation": VALIDATION,
    }
    (work / "curation.json").write_text(json.dumps(log, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return curation


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK, help="where traces and reports go")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="curated invariant file to write")
    parser.add_argument("--jobs", type=int, default=1, help="training runs collected in parallel")
    parser.add_argument("--reuse", action="store_true", help="reuse reference traces already in --work")
    args = parser.parse_args(argv)
    curation = build(args.work, args.output, args.jobs, args.reuse)
    print(f"default set: kept {len(curation.kept)} of {curation.candidates} candidates; "
          f"dropped {len(curation.dropped)} that fired on healthy validation runs -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
