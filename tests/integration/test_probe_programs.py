"""Healthy programs in styles the reference corpus lacks come back clean (zero-config).

The programs and the list of the ones still reported live in `benchmarks/probes/`; each
is collected for real and checked with the shipped default set, as a stranger's program
would be.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_RUNNER = Path(__file__).resolve().parents[2] / "benchmarks" / "probes" / "run.py"
_spec = importlib.util.spec_from_file_location("probes_runner", _RUNNER)
runner = sys.modules["probes_runner"] = importlib.util.module_from_spec(_spec)  # dataclasses look it up
_spec.loader.exec_module(runner)
KNOWN_FALSE_ALARMS, PROBES, run_probe = runner.KNOWN_FALSE_ALARMS, runner.PROBES, runner.run_probe

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("probe", [
    pytest.param(probe, id=probe.name, marks=[pytest.mark.xfail(reason=KNOWN_FALSE_ALARMS[probe.name], strict=True)]
                 if probe.name in KNOWN_FALSE_ALARMS else [])
    for probe in PROBES
])
def test_healthy_probe_is_clean_with_the_shipped_set(probe, tmp_path):
    row = run_probe(probe, tmp_path)
    assert row["clean"], f"{probe.name}: {row['verdict']}: {row.get('first') or row.get('tail', '')}"
