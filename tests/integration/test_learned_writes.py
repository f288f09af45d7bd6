"""InitSparesLearned on real (tiny, CPU) programs: learned from healthy pipelines that
initialise only new parameters, it catches initialisers that reach trained or loaded
weights in any stage, the setup window of a job that never trains included."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from torch import nn

import producers
from invariants.engine import Engine
from invariants.step_windows import StepWindows
from invariants.inference import infer
from invariants.invariant_set import InvariantSet
from producers.report import read_trace_dir

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
RELATION = "InitSparesLearned"


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(12, 8)
        self.proj = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def init_weights(self) -> None:
        """How many model libraries initialise: in place, through ``.data``."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.data.normal_(0.0, 0.02)
            if isinstance(module, nn.Linear):
                module.bias.data.zero_()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.proj(self.embed(tokens))).mean(1))


def _train(model: nn.Module, steps: int) -> None:
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randint(0, 12, (4, 5))).sum().backward()
        optimizer.step()


def _evaluate(model: nn.Module, batches: int = 2) -> None:
    model.eval()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randint(0, 12, (4, 5)))


def build_and_train() -> None:
    model = Tagger()
    model.init_weights()
    _train(model, 4)
    _evaluate(model)


def finetune_from_checkpoint() -> None:
    """Load a pretrained body, initialise a new head, keep a target copy in sync."""
    pretrained = Tagger()
    pretrained.init_weights()
    _train(pretrained, 2)
    body = {k: v.clone() for k, v in pretrained.state_dict().items() if not k.startswith("head.")}
    model = Tagger()
    model.init_weights()
    model.load_state_dict(body, strict=False)
    model.head = nn.Linear(8, 3)
    model.head.weight.data.normal_(0.0, 0.02)
    model.head.bias.data.zero_()
    target = Tagger().requires_grad_(False)
    target.load_state_dict(model.state_dict())
    for _ in range(3):
        _train(model, 1)
        with torch.no_grad():
            for kept, live in zip(target.parameters(), model.parameters()):
                kept.data.copy_(0.9 * kept + 0.1 * live)
    _evaluate(target)


def reinit_after_load(*, no_grad: bool = False) -> None:
    """An evaluation job: the checkpoint is loaded, then the weights are initialised again."""
    donor = Tagger()
    checkpoint = {k: torch.randn_like(v) for k, v in donor.state_dict().items()}
    model = Tagger()
    model.load_state_dict(checkpoint)
    if no_grad:
        with torch.no_grad():
            model.init_weights()
    else:
        model.init_weights()
    _evaluate(model, 3)


def reset_during_evaluation() -> None:
    """Training, then an evaluation that resets a trained layer (stage 'eval')."""
    model = Tagger()
    model.init_weights()
    _train(model, 3)
    model.eval()
    model.proj.reset_parameters()
    _evaluate(model)


def kfold_resets() -> None:
    """Cross-validation that resets its model between folds: re-initialising on purpose."""
    model = Tagger()
    for _ in range(2):
        for module in model.modules():
            if isinstance(module, nn.Linear):
                module.reset_parameters()
        _train(model, 2)


def _trace(program, root: Path, name: str, **kwargs) -> list[dict]:
    trace_dir = root / name
    with producers.instrument(run_id=name, trace_dir=trace_dir):
        torch.manual_seed(0)
        program(**kwargs)
    (batches,) = read_trace_dir(trace_dir).values()
    return batches


@functools.lru_cache(maxsize=None)
def _references(root: str) -> tuple[tuple[list[dict], ...], tuple]:
    traces = (_trace(build_and_train, Path(root), "ref-build"), _trace(finetune_from_checkpoint, Path(root), "ref-tune"))
    return traces, tuple(inv for inv in infer(list(traces)) if inv.relation == RELATION)


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    return _references(str(tmp_path_factory.mktemp("refs")))


def _check(invariants, batches) -> list:
    windows = StepWindows(Engine(InvariantSet(list(invariants))))
    found = [v for batch in batches for v in windows.feed(batch)]
    return found + windows.finish()


def test_learned_from_healthy_pipelines_without_context(references):
    _, rules = references
    by_api = {inv.params["api"]: inv for inv in rules}
    assert {"torch.Tensor.param_overwrite", "torch.nn.init.kaiming_uniform_", "torch.nn.init.normal_"} <= set(by_api)
    # every initialising write of both programs (copy_ excluded) is a positive example
    assert by_api["torch.Tensor.param_overwrite"].positive >= 12
    assert all(inv.negative == 0 and inv.precondition is None for inv in rules), "binds in every stage and mode"


def test_healthy_pipelines_pass(references):
    traces, rules = references
    for batches in traces:
        assert _check(rules, batches) == []


@pytest.mark.parametrize("no_grad", [False, True])
def test_initialising_loaded_weights_is_caught_in_the_setup_window(references, tmp_path, no_grad):
    _, rules = references
    violations = _check(rules, _trace(reinit_after_load, tmp_path, "bad", no_grad=no_grad))
    assert {(v.relation, v.step) for v in violations} == {(RELATION, 0)}
    (violation,) = violations
    assert violation.description.startswith("torch.Tensor.param_overwrite never writes")
    assert violation.evidence["first"]["trained"] is False  # loaded, never trained here


def test_resetting_a_trained_layer_during_evaluation_is_caught(references, tmp_path):
    _, rules = references
    violations = _check(rules, _trace(reset_during_evaluation, tmp_path, "bad"))
    assert {(v.description.split()[0], v.stage) for v in violations} == {
        ("torch.nn.init.kaiming_uniform_", "eval"), ("torch.nn.init.uniform_", "eval")}


def test_a_reference_that_resets_on_purpose_learns_no_rule_for_that_initialiser(references, tmp_path):
    traces, _ = references
    kfold = _trace(kfold_resets, tmp_path, "kfold")
    apis = {inv.params["api"] for inv in infer([*traces, kfold]) if inv.relation == RELATION}
    assert "torch.nn.init.kaiming_uniform_" not in apis
    assert "torch.Tensor.param_overwrite" in apis
