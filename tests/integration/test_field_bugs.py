"""The reproductions of publicly reported mistakes (``registry.FIELD_BUGS``), zero-config.

Every program runs twice under real ``trainwatch collect`` — with ``--bug`` and as its
healthy twin (single processes and 2-rank gloo jobs) — and is checked with
``trainwatch check`` and no ``-i``. Each bug must be reported within one step of its onset
by an invariant its twin does not violate; each twin must come back clean. Bugs the
shipped set misses are strict ``xfail``s carrying the registry's measured gap, so that the
change that catches one must also flip its marker. Marked slow: about a minute and a half
on 2 cores.
"""

from __future__ import annotations

import sys

import pytest

from frameworks_bench import bench
from registry import ALL_BUGS, BY_ID, FIELD_BUGS

pytestmark = pytest.mark.slow

#: bug id -> a relation that must be among those reported first
EXPECTED_RELATION = {
    "step_in_validation": "APIAbsent",
    "ranks_init_unsynced": "Consistent",
    "lr_diverges_across_ranks": "APIArg",
    "loss_requires_grad_hack": "EventContain",
    "clip_before_backward": "APISequence",
    "clip_after_step": "APISequence",
    "validation_backward_leaks_grads": "APIAbsent",
    "functional_dropout_in_eval": "TrainingFlag",
    "eval_without_eval_mode": "TrainingFlag",
    "layers_in_python_list": "ModuleRegistration",
    "double_softmax": "LossArguments",
    "mse_broadcast_target": "LossArguments",
    "detached_backbone_features": "ApiContract",
    "optimizer_recreated_each_epoch": "ApiContract",
    "load_prefix_mismatch": "ApiContract",
    "amp_clip_scaled_grads": "ApiContract",
    "distributed_sampler_no_set_epoch": "ApiContract",
    "frozen_bn_stats_updated": "ApiContract",
}


def _mark(case_id: str):
    gap = BY_ID[case_id].gap
    return pytest.param(case_id, marks=pytest.mark.xfail(strict=True, reason=gap)) if gap else case_id


def _jobs() -> list:
    jobs = []
    for case in FIELD_BUGS:
        jobs.append(bench.Job(case.id, "field", case.command(sys.executable, bug=True), bug=True,
                              twin=f"{case.id}.twin", onset=case.onset, in_setup=case.in_setup,
                              root_cause=case.root_cause))
        jobs.append(bench.Job(f"{case.id}.twin", "field", case.command(sys.executable, bug=False), bug=False))
    return jobs


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    """Collect and check every field bug and twin once, two at a time."""
    return {row.id: row for row in bench.run(_jobs(), tmp_path_factory.mktemp("field"), parallel=2)}


@pytest.mark.parametrize("bug_id", [_mark(case.id) for case in FIELD_BUGS])
def test_bug_is_caught_within_one_step_of_onset(rows, bug_id):
    row = rows[bug_id]
    assert row.collect_exit == 0, f"{bug_id}: training failed"
    assert row.verdict.startswith("caught"), (row.verdict, row.first)
    assert row.first_is_bug, f"{bug_id}: the first violation is not the bug: {row.first}"
    assert any(r.startswith(EXPECTED_RELATION[bug_id]) for r in row.first_step_relations), row.first_step_relations


@pytest.mark.parametrize("twin_id", [f"{case.id}.twin" for case in FIELD_BUGS])
def test_healthy_twin_is_clean(rows, twin_id):
    row = rows[twin_id]
    assert row.collect_exit == 0, f"{twin_id}: training failed"
    assert row.verdict == "clean", (row.verdict, row.first)
    assert row.windows_checked > 0


def test_registry_counts_and_sources():
    ids = [case.id for case in ALL_BUGS]
    assert len(set(ids)) == len(ids), "reproduction ids are unique"
    assert len(ALL_BUGS) >= 40
    assert len({case.cause_class for case in ALL_BUGS}) >= 20
    for case in ALL_BUGS:
        assert case.source.strip() and case.cause_class.strip(), case.id
        assert case.path.is_file() and case.root_cause, case.id
        assert case.in_setup or 0 < case.onset < case.steps, case.id
    for case in FIELD_BUGS:
        assert _source_named_in_docstring(case), f"{case.id}: the program's docstring names {case.source}"
    assert set(EXPECTED_RELATION) == {case.id for case in FIELD_BUGS if not case.gap}


def _source_named_in_docstring(case) -> bool:
    """Each ``owner/repo-N`` of a source is named in the docstring as "repo ... N" (prose
    writes "PyTorch issue 26338" for ``pytorch/pytorch-26338``)."""
    module_doc = case.path.read_text(encoding="utf-8").split('"""')[1]
    text = " ".join(module_doc.split()).lower()
    for source in case.source.split(" / "):
        repo, _, number = source.rpartition("-")
        if repo.rsplit("/", 1)[-1].lower() not in text or number not in text:
            return False
    return True
