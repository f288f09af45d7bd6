"""The framework benchmark's registry: which program, launched how, healthy or with which
planted bug, and where that bug starts.

Data only, like ``benchmarks/silent_bugs/registry.py``. ``onset`` counts training
iterations from 0 (the programs' ``--onset``); ``silent_bugs/registry.onset_step`` turns
it into a trace step once it is known whether the trace opens with a setup window.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent

SINGLE, TORCHRUN_2 = "single", "torchrun-2"


@dataclass(frozen=True)
class FrameworkProgram:
    id: str
    script: str
    #: extra flags; a bug program's flags include ``--bug NAME``
    flags: tuple[str, ...] = ()
    launch: str = SINGLE
    #: the healthy program this bug is the twin of (``None``: this program is healthy)
    twin: str | None = None
    onset: int = 6
    steps: int = 12
    #: names a violation should mention to point at the root cause (case-insensitive)
    root_cause: tuple[str, ...] = ()
    notes: str = ""

    @property
    def healthy(self) -> bool:
        return self.twin is None

    def command(self, python: str = sys.executable, *, seed: int = 0) -> list[str]:
        launcher = [python] if self.launch == SINGLE else [
            python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        ]
        return [*launcher, str(HERE / self.script), "--steps", str(self.steps), "--onset", str(self.onset),
                "--seed", str(seed), *self.flags]


PROGRAMS: tuple[FrameworkProgram, ...] = (
    FrameworkProgram("hf_trainer", "hf_trainer.py"),
    FrameworkProgram("hf_trainer_grad_accum", "hf_trainer.py", ("--grad-accum", "2")),
    FrameworkProgram("hf_trainer_frozen_embeddings", "hf_trainer.py", ("--freeze-embeddings",)),
    FrameworkProgram("hf_trainer_ddp", "hf_trainer.py", launch=TORCHRUN_2),
    FrameworkProgram("lightning", "lightning_trainer.py"),
    FrameworkProgram("lightning_ddp", "lightning_trainer.py", ("--devices", "2"),
                     notes="Lightning starts the second process itself (subprocess launcher)"),
    FrameworkProgram("accelerate", "accelerate_loop.py"),
    FrameworkProgram("accelerate_warmup_from_zero", "accelerate_loop.py", ("--warmup",),
                     notes="the first optimizer step runs at learning rate 0 and legitimately changes nothing"),
    FrameworkProgram("hf_trainer_eval_dropout", "hf_trainer.py", ("--bug", "eval_dropout"), twin="hf_trainer",
                     root_cause=("dropout", "DropoutHead", "training")),
    FrameworkProgram("hf_trainer_frozen_updated", "hf_trainer.py", ("--freeze-embeddings", "--bug", "frozen_updated"),
                     twin="hf_trainer_frozen_embeddings", root_cause=("embeddings", "requires_grad")),
    FrameworkProgram("hf_trainer_ddp_rank_drift", "hf_trainer.py", ("--bug", "rank_drift"), launch=TORCHRUN_2,
                     twin="hf_trainer_ddp", root_cause=("classifier.dense",)),
    FrameworkProgram("lightning_stale_optimizer", "lightning_trainer.py", ("--bug", "stale_optimizer"),
                     twin="lightning", root_cause=("Optimizer.step", "net.")),
    FrameworkProgram("lightning_ddp_rank_drift", "lightning_trainer.py", ("--devices", "2", "--bug", "rank_drift"),
                     twin="lightning_ddp", root_cause=("h.0.",)),
    FrameworkProgram("accelerate_eval_dropout", "accelerate_loop.py", ("--bug", "eval_dropout"), twin="accelerate",
                     root_cause=("dropout", "training", "stage 'eval'")),
)

BY_ID = {program.id: program for program in PROGRAMS}
