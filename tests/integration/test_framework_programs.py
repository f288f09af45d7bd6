"""The framework programs (Hugging Face ``Trainer``, Lightning, ``accelerate``) zero-config.

Marked slow (about a minute on 2 cores, on top of the run-model programs' 100 s: fourteen
framework runs, four of them with two ranks). The ``test`` extra installs the frameworks;
where they are missing the module is skipped, except in CI
(``TRAINWATCH_REQUIRE_SYSTEM_DEPS=1``), where that is an error. Same acceptance as the run-model programs: healthy runs clean, each
planted bug reported within one step of its onset and first. What the current producer cannot meet is a strict ``xfail`` naming why.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

_missing = [name for name in ("transformers", "lightning", "accelerate") if importlib.util.find_spec(name) is None]
if _missing:  # the test extra installs them; CI must not pass by skipping them
    _reason = f"framework packages not installed: {', '.join(_missing)} (pip install -e '.[test]')"
    if os.environ.get("TRAINWATCH_REQUIRE_SYSTEM_DEPS") == "1":
        raise RuntimeError(_reason)
    pytest.skip(_reason, allow_module_level=True)

pytestmark = pytest.mark.slow

from frameworks_bench import bench  # noqa: E402
from programs import BY_ID, PROGRAMS  # noqa: E402

NOT_YET = {
    "hf_trainer_frozen_updated": "no rule relates a frozen parameter that starts to change",
}


def _param(program_id: str):
    reason = NOT_YET.get(program_id)
    return pytest.param(program_id, marks=pytest.mark.xfail(strict=True, reason=reason)) if reason else program_id


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    work = tmp_path_factory.mktemp("frameworks")
    return {row.id: row for row in bench.run(bench.jobs_for("frameworks"), work, parallel=2)}


@pytest.mark.parametrize("program_id", [_param(p.id) for p in PROGRAMS if p.healthy])
def test_healthy_framework_run_is_clean(rows, program_id):
    row = rows[program_id]
    assert row.collect_exit == 0, f"{program_id}: training failed"
    assert row.verdict == "clean", (row.verdict, row.first)
    assert row.windows_checked >= BY_ID[program_id].steps, "every training iteration is a checked window"


@pytest.mark.parametrize("program_id", [_param(p.id) for p in PROGRAMS if not p.healthy])
def test_planted_bug_is_caught_first(rows, program_id):
    row = rows[program_id]
    assert row.collect_exit == 0, f"{program_id}: training failed"
    assert row.verdict.startswith("caught"), (row.verdict, row.first)
    assert row.first_is_bug, row.first
