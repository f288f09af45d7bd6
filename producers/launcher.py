"""Running an unmodified training command under instrumentation.

The command is started with `producers/bootstrap` first on ``PYTHONPATH`` and the
producer settings in ``TRAINWATCH_*`` variables; every Python process it starts
inherits both.  Signals sent to the launcher are forwarded, and the command's exit
code is passed through.  Nothing here imports torch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from .config import ProducerConfig

BOOTSTRAP_DIR = Path(__file__).resolve().parent / "bootstrap"


class LaunchError(RuntimeError):
    """The command could not be started (the message is one line for the user)."""


def check_trace_dir(path: str | os.PathLike[str]) -> Path:
    """Create the trace directory and prove it is writable, before training starts."""
    directory = Path(path)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise LaunchError(f"trace directory {directory} is not writable: {exc.strerror or exc}") from None
    return directory


def child_environment(config: ProducerConfig, base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.update(config.to_env())
    existing = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(BOOTSTRAP_DIR) + (os.pathsep + existing if existing else "")
    return env


@dataclass
class LaunchResult:
    returncode: int
    stats_dir: Path


def run_instrumented(command: Sequence[str], config: ProducerConfig, stats_dir: Path) -> LaunchResult:
    """Run ``command`` to completion; returns its exit code (128+N if killed by signal N)."""
    env = child_environment(config)
    try:
        process = subprocess.Popen(list(command), env=env)
    except FileNotFoundError:
        raise LaunchError(f"command not found: {command[0]}") from None
    except PermissionError:
        raise LaunchError(f"command is not executable: {command[0]}") from None
    except OSError as exc:
        raise LaunchError(f"cannot start {command[0]}: {exc.strerror or exc}") from None

    def forward(signum: int, _frame: object) -> None:
        if process.poll() is None:
            process.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        returncode = process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if returncode < 0:
        returncode = 128 - returncode
    return LaunchResult(returncode, stats_dir)
