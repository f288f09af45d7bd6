"""Running multi-rank programs in tests despite gloo's teardown abort.

torch's gloo backend can abort a rank while its interpreter exits ("terminate called
without an active exception", SIGABRT) after training finished: seen here with and
without trainwatch, more often on a loaded machine (2 of 10 plain two-rank runs beside a
benchmark). A run that failed that way, and only that way, is run once more into a clean
output directory; any other failure stands.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any, Sequence

GLOO_TEARDOWN_ABORT = "terminate called without an active exception"


def run_program(argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, capture_output=True, text=True, **kwargs)``, once more after
    a gloo teardown abort (clearing the ``-o`` directory a ``collect`` wrote)."""
    result = subprocess.run(list(argv), capture_output=True, text=True, **kwargs)
    if result.returncode == 0 or GLOO_TEARDOWN_ABORT not in (result.stdout or "") + (result.stderr or ""):
        return result
    if "-o" in argv[:-1]:
        shutil.rmtree(Path(argv[list(argv).index("-o") + 1]), ignore_errors=True)
    return subprocess.run(list(argv), capture_output=True, text=True, **kwargs)
