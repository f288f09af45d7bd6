"""The records of the silent-bug benchmark: a reproduction with its healthy twin, or a
healthy program alone, and how a bug's onset iteration maps to a trace step."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent

SINGLE = "single"
TORCHRUN_2 = "torchrun-2"

@dataclass(frozen=True)
class BugCase:
    id: str
    title: str
    #: The documented public case the reproduction is modelled on.
    source: str
    #: Names (API families, variable-name fragments) a violation should mention to count
    #: as pointing at the root cause; matched case-insensitively as substrings.
    root_cause: tuple[str, ...]
    #: The invariant relation expected to catch it (a template name in docs/invariants.md).
    expected_relation: str
    launch: str = SINGLE
    onset: int = 3
    steps: int = 6
    notes: str = ""
    #: Why the shipped default set cannot catch it today (see GAPS.md), if it cannot.
    gap: str = ""
    script: str = field(default="")
    #: The root-cause class (one short phrase): reproductions sharing it are the same
    #: mistake in different programs; the benchmark counts classes and can hold one out.
    cause_class: str = ""
    #: The bug lives in the setup window (construction, initialisation, DataLoader start-up)
    #: of a program that never trains: it is live from trace step 0 and ``onset`` is unused.
    in_setup: bool = False

    @property
    def path(self) -> Path:
        return HERE / (self.script or f"{self.id}.py")

    def command(self, python: str, *, bug: bool, seed: int = 0, steps: int | None = None) -> list[str]:
        """The training command, ready to be run under ``trainwatch collect -- ...``."""
        launcher = [python] if self.launch == SINGLE else [
            python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        ]
        flags = ["--onset", str(self.onset), "--steps", str(steps or self.steps), "--seed", str(seed)]
        return launcher + [str(self.path)] + flags + (["--bug"] if bug else [])


@dataclass(frozen=True)
class HealthyProgram:
    """A healthy program with no buggy twin: it must come back clean."""

    id: str
    title: str
    source: str
    launch: str = SINGLE
    steps: int = 6

    @property
    def path(self) -> Path:
        return HERE / f"{self.id}.py"

    def command(self, python: str, *, seed: int = 0, steps: int | None = None) -> list[str]:
        launcher = [python] if self.launch == SINGLE else [
            python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        ]
        return launcher + [str(self.path), "--steps", str(steps or self.steps), "--seed", str(seed)]


def onset_step(onset: int, *, in_setup: bool, setup_window: bool) -> int:
    """The trace step at which a bug is live: 0 for a setup-window bug; otherwise its
    iteration index ``onset``, shifted by one when the trace opens with a setup window."""
    if in_setup:
        return 0
    return onset + (1 if setup_window else 0)
