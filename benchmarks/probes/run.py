"""Healthy programs in styles the reference corpus lacks, checked with the shipped default set.

    python benchmarks/probes/run.py [--work DIR] [--only NAME ...] [--write-results]

Each program here was written after the shipped set was built, modelled on a public
recipe or a common way of writing training code that none of the reference pipelines
uses (trainer options, sharding, TorchScript, higher-order gradients, sparse gradients,
rank-local work, optimizer wrappers...). Every one must come back clean from
``trainwatch check`` with no ``-i``: a violation is a false alarm a stranger's program
would see. The ones that are not clean yet are listed in ``KNOWN_FALSE_ALARMS`` with the
reason; `tests/integration/test_probe_programs.py` runs the same list.
"""

from __future__ import annotations

import argparse
import ast
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE.parent / "silent_bugs"))

from harness import check, collect  # noqa: E402

BEGIN, END = "<!-- probes:begin -->", "<!-- probes:end -->"


@dataclass(frozen=True)
class Probe:
    name: str
    path: Path
    ranks: int = 1
    args: tuple[str, ...] = field(default_factory=tuple)

    def command(self, scratch: Path) -> list[str]:
        launcher = [sys.executable] if self.ranks == 1 else [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(self.ranks)]
        return launcher + [str(self.path), *(arg.format(scratch=scratch) for arg in self.args)]

    @property
    def modelled_on(self) -> str:
        doc = ast.get_docstring(ast.parse(self.path.read_text(encoding="utf-8"))) or ""
        return doc.split("\n\n")[0].replace("\n", " ").removeprefix("Healthy probe: ")


PROBES: tuple[Probe, ...] = (
    *(Probe(name, HERE / f"{name}.py") for name in (
        "hf_t5", "hf_vit", "hf_gpt2_ckpt", "lightning_es", "accel_accum", "swa_bf16", "amp_scaler",
        "multitask_alt", "moco_p0", "rollout_p0", "prune_wn", "maml_func", "sparse_emb", "jit_script",
        "misc_loops", "dataparallel", "lm_flat", "gnn_graphcls", "unfreeze", "kfold", "opt_switch", "sam_opt",
        "hf_ner", "timm_style", "embedding_maxnorm", "dqn_hard", "ddp_spawn_nosync", "mc_dropout", "mean_teacher",
        "kd_hinton", "beta_vae", "multilabel_tags", "ctc_gru", "clip_infonce", "focal_dense", "compiled_forecast",
        "seq2seq_pad", "ohem_hard", "wgan_gp_toggle", "ppo_continuous", "ddpm_foreach_ema", "lora_merge",
        "ckpt_accum", "precise_bn", "nan_skip_warmup", "hf_mlm", "hf_weighted_freeze", "hf_accum_best",
        "lightning_gan_clip", "lightning_ckpt_test", "lightning_bf16_predict", "accel_two_models", "hf_gpt2_generate",
        "hf_custom_head", "finetune_phases", "amp_accum_clip", "sampler_train_eval")),
    Probe("tp", HERE / "tp.py", ranks=2),
    Probe("accel_ddp", HERE / "accel_ddp.py", ranks=2),
    Probe("zero_ddp", HERE / "zero_ddp.py", ranks=2),
    Probe("fsdp2", REPO / "examples" / "fsdp2_gloo.py", ranks=2, args=("--steps", "6")),
    Probe("ddp_rank0_eval", REPO / "tests" / "data" / "programs" / "ddp_rank0_eval.py", ranks=2,
          args=("9", "{scratch}")),
)

#: probes still reported, and why (each a strict expected failure in the test)
KNOWN_FALSE_ALARMS = {
    "ohem_hard": "online hard-example mining scores the batch without gradients with the trained model still in "
                 "training mode (dropout on), as mmdetection's OHEMSampler does; 'dropout runs in evaluation mode "
                 "whenever gradients are disabled' cannot tell that pass from an evaluation that forgot eval(): "
                 "both are no-grad passes of the trained model between two optimizer steps",
}


def run_probe(probe: Probe, work: Path) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        collected = collect(probe.command(Path(scratch)), work / probe.name / "traces", f"probe-{probe.name}",
                            timeout_s=300.0)
    if collected.returncode != 0:
        return {"name": probe.name, "verdict": f"collect exited {collected.returncode}",
                "clean": False, "tail": collected.output_tail}
    result = check(collected.trace_dir, work / probe.name / "check.json")
    violations = result.violations
    first = violations[0]["description"] if violations else ""
    return {"name": probe.name, "clean": result.exit_code == 0 and not violations, "first": first,
            "verdict": "clean" if result.exit_code == 0 else f"exit {result.exit_code}",
            "violated": len(result.violated_invariants)}


def render(rows: list[dict], command: str, minutes: float) -> str:
    clean = sum(1 for row in rows if row["clean"])
    lines = [BEGIN, "## Healthy probes outside the corpus (`benchmarks/probes/run.py`)", "",
             f"Command: `{command}` — {minutes:.1f} min on the 2-core development machine "
             f"({time.strftime('%Y-%m-%d', time.gmtime())}), shipped default set, no `-i`.", "",
             f"Clean: **{clean} / {len(rows)}**.", "",
             "| program | modelled on | verdict | first violated invariant |", "|---|---|---|---|"]
    by_name = {probe.name: probe for probe in PROBES}
    for row in rows:
        known = KNOWN_FALSE_ALARMS.get(row["name"], "")
        lines.append(f"| `{row['name']}` | {by_name[row['name']].modelled_on} | {row['verdict']} | "
                     f"{row.get('first', '') or '—'}{' (known: ' + known + ')' if known and not row['clean'] else ''} |")
    return "\n".join(lines + ["", END])


def write_results(section: str) -> None:
    results = REPO / "benchmarks" / "RESULTS.md"
    text = results.read_text(encoding="utf-8")
    if BEGIN in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section + rest.split(END, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    results.write_text(text, encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "trainwatch-probes")
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args()
    started = time.monotonic()
    rows = []
    for probe in PROBES:
        if args.only and probe.name not in args.only:
            continue
        row = run_probe(probe, args.work)
        rows.append(row)
        print(f"{probe.name:<16} {row['verdict']:<18} {row.get('first', '')}", flush=True)
    print(f"clean: {sum(r['clean'] for r in rows)} / {len(rows)}")
    if args.write_results and not args.only:
        write_results(render(rows, "python benchmarks/probes/run.py --write-results",
                             (time.monotonic() - started) / 60))
    return 0


if __name__ == "__main__":
    sys.exit(main())
