"""A fast slice of the silent-bug benchmark, with exact expectations.

Six reproductions — one per relation family that the shipped default set must cover, plus
the type-free first-forward and batch-keeping rules — and their healthy twins run under
real ``trainwatch collect`` (single process and a 2-rank gloo job), then
``trainwatch check`` with *no* ``-i``: the zero-configuration
path users get. Each bug must be reported at its onset step or the next by the named
relation, and each twin must come back clean. A change to the producer, the core or the
default set that loses one of these detections fails here.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "silent_bugs"))

import harness  # noqa: E402
from registry import BUGS, BY_ID, onset_step  # noqa: E402
from scoring import DETECTION_WINDOW, score  # noqa: E402

#: bug id -> the relation that must report it first (within DETECTION_WINDOW of onset)
FAST_SUBSET = {
    "missing_zero_grad": "APISequence",
    "eval_dropout_attention": "TrainingFlag",
    "reinit_every_step": "APIAbsent",
    "ddp_raw_module": "Consistent",
    # the two rules that need no user class and no healthy run of the pipeline itself
    "spectral_norm_eval_first": "TrainingFlag",
    "preprocess_batch_size": "APIOutput",
}


@pytest.fixture(scope="module")
def checked_runs(tmp_path_factory):
    """Collect every bug and twin once (two at a time), check each with the default set."""
    work = tmp_path_factory.mktemp("silent_bugs")

    def run(job: tuple[str, bool]) -> tuple[tuple[str, bool], harness.CheckResult]:
        bug_id, bug = job
        case = BY_ID[bug_id]
        label = "bug" if bug else "twin"
        trace_dir = work / bug_id / label
        collected = harness.collect(case.command(sys.executable, bug=bug, steps=case.onset + 2), trace_dir,
                                    run_id=f"{bug_id}-{label}", timeout_s=150)
        assert collected.returncode == 0, f"{bug_id} {label} training failed:\n{collected.output_tail}"
        return job, harness.check(trace_dir, work / bug_id / f"{label}.json")

    jobs = [(bug_id, bug) for bug_id in FAST_SUBSET for bug in (True, False)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(run, jobs))


@pytest.mark.parametrize("bug_id", sorted(FAST_SUBSET))
def test_bug_is_caught_at_onset_by_the_expected_relation(checked_runs, bug_id):
    case = BY_ID[bug_id]
    result = checked_runs[(bug_id, True)]
    assert result.exit_code == 1, f"{bug_id}: check exit {result.exit_code} {result.error}"
    detection = score(result.violations, onset_step(case.onset, in_setup=case.in_setup, setup_window=True),
                      case.root_cause)
    assert detection.early_violations == 0, f"{bug_id}: violations before the onset: {result.violations[:2]}"
    assert detection.first_step is not None and 0 <= detection.delay <= DETECTION_WINDOW, detection
    assert FAST_SUBSET[bug_id] in detection.relations, detection.relations


@pytest.mark.parametrize("bug_id", sorted(FAST_SUBSET))
def test_healthy_twin_is_clean(checked_runs, bug_id):
    result = checked_runs[(bug_id, False)]
    assert result.exit_code == 0, [v["description"] for v in result.violations][:5]
    assert result.invariants_checked > 0


def test_registry_describes_every_reproduction():
    assert len(BUGS) >= 16
    assert len({case.id for case in BUGS}) == len(BUGS)
    for case in BUGS:
        assert case.path.is_file(), case.path
        assert case.root_cause and case.source and case.expected_relation
        assert 0 < case.onset < case.steps
        assert "--bug" in case.command("python", bug=True) and "--bug" not in case.command("python", bug=False)


def test_scoring_separates_onset_late_and_early_violations():
    onset = 3
    on_time = [{"step": 4, "relation": "Consistent", "description": "param data equal across ranks"}]
    assert score(on_time, onset, ["param"]).detected
    assert score(on_time, onset, ["param"]).names_root_cause
    late = [{"step": 6, "relation": "Consistent", "description": "x"}]
    assert not score(late, onset, []).detected and score(late, onset, []).delay == 3
    early = [{"step": 1, "relation": "APIArg", "description": "y"}] + on_time
    detection = score(early, onset, ["zzz"])
    assert detection.early_violations == 1 and detection.first_step == 4 and not detection.names_root_cause
    assert score([], onset, []).first_step is None


def test_curation_rules_keep_behaviour_and_drop_artefacts():
    from build_default_set import without_helper_context_guard
    from shipping_rules import is_collective_habit, is_configuration_pin, is_dtype_artefact, is_evaluation_seeding

    autocast = {"negated": False, "any": [{"all": [{"field": "ctx.autocast", "kind": "constant", "values": ["bfloat16"]}]}]}
    dtype = {"relation": "APIOutput", "params": {"form": "constant", "prop": "dtype", "value": "float32"}}
    assert is_dtype_artefact({**dtype, "precondition": None})
    assert not is_dtype_artefact({**dtype, "precondition": autocast})
    assert not is_dtype_artefact({"relation": "APIOutput", "params": {"form": "same_as_input", "prop": "dtype"}})

    call = {"relation": "EventContain", "params": {"form": "call", "child": "torch.nn.functional.dropout"}}
    assert is_configuration_pin({**call, "params": {**call["params"], "args": {"p": 0.1}}})
    assert not is_configuration_pin({**call, "params": {**call["params"], "args": {"training": True}}})

    seeding = {"relation": "APIAbsent", "params": {"api": "torch.manual_seed", "after_step": -1}}
    assert is_evaluation_seeding({**seeding, "params": {**seeding["params"], "stage": "eval"}})
    assert not is_evaluation_seeding({**seeding, "params": {**seeding["params"], "stage": "train"}})
    broadcast = {"relation": "APIAbsent", "params": {"api": "torch.distributed.broadcast", "stage": "train"}}
    assert is_collective_habit(broadcast)
    assert not is_collective_habit({**broadcast, "params": {**broadcast["params"], "stage": "eval"}})

    from shipping_rules import is_data_agreement, is_harmless_absence, is_setup_call_agreement, is_setup_habit

    assert is_harmless_absence({"relation": "APIAbsent", "params": {"api": "torch.optim.Optimizer.zero_grad",
                                                                    "stage": "eval", "after_step": -1}})
    assert is_setup_call_agreement({"relation": "APIArg", "params": {"api": "torch.nn.init.kaiming_uniform_",
                                                                     "arg": "tensor", "form": "ranks"}})
    assert not is_setup_call_agreement({"relation": "APIArg", "params": {"api": "torch.distributed.all_reduce",
                                                                         "arg": "op", "form": "ranks"}})

    assert is_setup_habit({"relation": "APIAbsent", "params": {"api": "torch.nn.Module.forward", "stage": "init",
                                                               "after_step": -1}})
    assert not is_setup_habit({"relation": "APIAbsent", "params": {"api": "torch.optim.Optimizer.step",
                                                                   "stage": "eval", "after_step": -1}})

    same_input = {"relation": "APIArg", "params": {"api": "torch.nn.Module.forward", "arg": "0", "form": "ranks"}}
    assert is_data_agreement(same_input)
    assert not is_data_agreement({**same_input, "params": {**same_input["params"], "api": "torch.distributed.all_reduce"}})
    dropout = {"relation": "APIArg", "params": {"api": "torch.nn.functional.dropout", "arg": "input", "form": "ranks"}}
    assert is_data_agreement(dropout)  # an activation: each rank pads its own batch
    assert not is_data_agreement({**dropout, "params": {**dropout["params"], "arg": "p"}})

    from shipping_rules import MIN_POSITIVES_RARE_CALLS, is_contract_only_habit, min_positives

    epoch_pass = "torch.utils.data.DataLoader.__iter__"
    sampler_seed = {"relation": "APIArg", "params": {"api": epoch_pass, "arg": "sampler_seed", "form": "ranks"}}
    assert not is_contract_only_habit(sampler_seed)
    assert min_positives(sampler_seed) == MIN_POSITIVES_RARE_CALLS
    assert is_contract_only_habit({"relation": "APIAbsent", "params": {"api": epoch_pass, "stage": "eval"}})
    assert is_contract_only_habit({"relation": "APISequence", "params": {"first": epoch_pass,
                                                                         "then": "torch.optim.Optimizer.step"}})

    guarded = {"id": "inv-x", "apis": ["torch.utils.data.worker_init"], "precondition": autocast}
    assert without_helper_context_guard(guarded) == {"apis": ["torch.utils.data.worker_init"], "precondition": None}
    other = {"id": "inv-y", "apis": ["torch.nn.Module.forward"], "precondition": autocast}
    assert without_helper_context_guard(other) is other


def test_shipping_rules_need_pipelines_of_several_styles_examples_and_agreed_constants():
    from shipping_rules import MIN_POSITIVES, evidence_reasons, pinned_values, shape

    rule = {"relation": "TrainingFlag", "params": {"api": "torch.nn.functional.dropout", "stage": "eval",
                                                   "training": False}, "examples": {"positive": MIN_POSITIVES}}
    three_styles = {shape(rule): {"mlp", "lstm_classifier", "ddp_torchrun"}}
    assert evidence_reasons(rule, three_styles, {}) == []
    one_style = {shape(rule): {"mlp", "mlp_regression_sgd", "ddp_torchrun"}}  # two MLP loops are one style
    assert [r.split(" ")[0] for r in evidence_reasons(rule, one_style, {})] == ["styles"]
    few = dict(rule, examples={"positive": MIN_POSITIVES - 1})
    assert [r.split(" ")[0] for r in evidence_reasons(few, three_styles, {})] == ["positive"]
    workers = {"relation": "APIArg", "params": {"api": "torch.utils.data.worker_init", "arg": "dataset_rng_digest",
                                                "form": "distinct"}, "examples": {"positive": 6}}
    worker_support = {shape(workers): {"dataloader_augment", "cnn_bn_dropout", "segmentation_owned_rng"}}
    assert evidence_reasons(workers, worker_support, {}) == []  # workers start once an epoch
    assert [r.split(" ")[0] for r in evidence_reasons(dict(workers, examples={"positive": 5}), worker_support, {})] == [
        "positive"]
    for contract, api in (("steps_once_per_epoch", "torch.optim.lr_scheduler.LRScheduler.step"),
                          ("fresh_dataset_rng", "torch.utils.data.worker_init")):
        per_epoch = {"relation": "ApiContract", "params": {"contract": contract, "api": api},
                     "examples": {"positive": 6}}
        per_epoch_support = {shape(per_epoch): {"mnist_examples", "siamese_examples", "pointnet_owned_rng"}}
        assert evidence_reasons(per_epoch, per_epoch_support, {}) == []  # judged once an epoch
        assert [r.split(" ")[0] for r in evidence_reasons(per_epoch, {shape(per_epoch): {"mnist_examples"}}, {})] == [
            "pipelines", "styles"]
    per_step = {"relation": "ApiContract", "params": {"contract": "keeps_learning", "api": "torch.optim.Optimizer.step"},
                "examples": {"positive": 6}}
    assert [r.split(" ")[0] for r in evidence_reasons(per_step, {shape(per_step): {"mlp", "lstm_classifier",
                                                                                   "ddp_torchrun"}}, {})] == ["positive"]
    assert any(r.startswith("keyed on a user class") for r in evidence_reasons(
        {"relation": "TrainingFlag", "params": {**rule["params"], "mtype": "Net"}, "examples": rule["examples"]},
        three_styles, {}))

    def pin(value):
        return {"relation": "APIOutput", "precondition": autocast_pre(),
                "params": {"form": "constant", "api": "torch.nn.functional.linear", "prop": "dtype", "value": value}}

    def autocast_pre():
        return {"negated": False, "any": [{"all": [{"field": "ctx.autocast", "kind": "constant",
                                                     "values": ["bfloat16"]}]}]}

    agreed = pinned_values({"mlp": [pin("bfloat16")], "cnn_bn_dropout": [pin("bfloat16")]})
    disputed = pinned_values({"mlp": [pin("bfloat16")], "cnn_bn_dropout": [pin("float16")]})
    support = {shape(dict(pin("bfloat16"), examples=None)): {"mlp", "lstm_classifier", "ddp_torchrun"}}
    candidate = dict(pin("bfloat16"), examples={"positive": MIN_POSITIVES})
    assert evidence_reasons(candidate, support, agreed) == []
    assert [r.split(":")[0] for r in evidence_reasons(candidate, support, disputed)] == [
        "pipelines pin different values"]


def test_audit_of_a_missing_invariant_file_is_one_line_and_exit_2(tmp_path, capsys):
    from build_default_set import main

    assert main(["--audit", str(tmp_path / "absent.json"), "--work", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no invariant file" in err[0]
