"""The run-model programs of the silent-bug benchmark, zero-config, with exact expectations.

Every bug of ``registry.RUN_MODEL_BUGS`` with its healthy twin and every program of
``registry.RUN_MODEL_HEALTHY`` runs under real ``trainwatch collect`` (single processes and
a 2-rank gloo job of a ``torch.compile``d DDP model), then ``trainwatch check`` with no
``-i``. The assertions are the acceptance of the run model: each bug reported within one
step of its onset (converted to a trace step by ``registry.onset_step``), each healthy
program clean. Cases the current producer cannot meet yet are strict ``xfail``s naming
why, so that the change that makes one pass must also flip its marker.
"""

from __future__ import annotations

import pytest

from frameworks_bench import bench
from registry import BY_ID, RUN_MODEL_BUGS, RUN_MODEL_HEALTHY

#: bug id -> a relation that must be among those reported first
EXPECTED_RELATION = {
    "manual_sgd_grad_accumulates": "APISequence",
    "manual_sgd_update_discarded": "APISequence",
    "gan_module_zero_grad": "APISequence",
    "two_optimizers_one_forgotten": "APISequence",
    "optimizer_holds_stale_params": "EventContain",
    "reinit_after_load": "InitSparesLearned",
    "dataloader_only_same_rng": "APIArg",
    "compiled_ddp_drift": "Consistent",
}

NOT_YET: dict[str, str] = {}


def _mark(case_id: str):
    reason = NOT_YET.get(case_id)
    return pytest.param(case_id, marks=pytest.mark.xfail(strict=True, reason=reason)) if reason else case_id


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    """Collect and check every run-model program once, two at a time."""
    work = tmp_path_factory.mktemp("run_model")
    return {row.id: row for row in bench.run(bench.jobs_for("run-model"), work, parallel=2)}


@pytest.mark.parametrize("bug_id", [_mark(case.id) for case in RUN_MODEL_BUGS])
def test_bug_is_caught_within_one_step_of_onset(rows, bug_id):
    row = rows[bug_id]
    assert row.collect_exit == 0, f"{bug_id}: training failed"
    assert row.verdict.startswith("caught"), (row.verdict, row.first)
    assert row.first_is_bug, f"{bug_id}: the first violation is not the bug: {row.first}"
    assert any(r.startswith(EXPECTED_RELATION[bug_id]) for r in row.first_step_relations), row.first_step_relations


@pytest.mark.parametrize("program_id", [_mark(f"{case.id}.twin") for case in RUN_MODEL_BUGS]
                         + [_mark(program.id) for program in RUN_MODEL_HEALTHY])
def test_healthy_program_is_clean(rows, program_id):
    row = rows[program_id]
    assert row.collect_exit == 0, f"{program_id}: training failed"
    assert row.verdict == "clean", (row.verdict, row.first)
    assert row.windows_checked > 0


def test_setup_window_bugs_are_judged_at_step_zero_and_others_after_the_setup_window():
    from registry import onset_step

    setup_bug, loop_bug = BY_ID["reinit_after_load"], BY_ID["manual_sgd_grad_accumulates"]
    assert setup_bug.in_setup and not loop_bug.in_setup
    for setup_window in (True, False):
        assert onset_step(setup_bug.onset, in_setup=True, setup_window=setup_window) == 0
    assert onset_step(loop_bug.onset, in_setup=False, setup_window=False) == loop_bug.onset
    assert onset_step(loop_bug.onset, in_setup=False, setup_window=True) == loop_bug.onset + 1


def test_registry_describes_every_run_model_program():
    ids = [case.id for case in RUN_MODEL_BUGS] + [program.id for program in RUN_MODEL_HEALTHY]
    assert len(set(ids)) == len(ids) and set(EXPECTED_RELATION) == {case.id for case in RUN_MODEL_BUGS}
    for case in RUN_MODEL_BUGS:
        assert case.path.is_file() and case.root_cause and case.source
        assert case.in_setup or 0 < case.onset < case.steps
    for program in RUN_MODEL_HEALTHY:
        assert program.path.is_file()
