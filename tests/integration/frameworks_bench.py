"""The frameworks runner (benchmarks/frameworks/run.py), importable by the tests.

benchmarks/silent_bugs has a run.py too, so the runner is loaded under its own name;
its sibling modules (programs, registry, harness) come from the benchmark directories.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "benchmarks" / "frameworks"), str(ROOT / "benchmarks" / "silent_bugs")]

_spec = importlib.util.spec_from_file_location("frameworks_run", ROOT / "benchmarks" / "frameworks" / "run.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules["frameworks_run"] = bench
_spec.loader.exec_module(bench)
