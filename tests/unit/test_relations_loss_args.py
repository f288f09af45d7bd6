"""LossArguments: losses that normalise their input never get probabilities; elementwise
losses compare tensors of one shape.  Only the arguments each loss's contract names
become hypotheses."""

from __future__ import annotations

from invariants.inference import Inferencer
from invariants.relations import TEMPLATES
from tests.support.relation_batches import call_batch, check

F = "torch.nn.functional."


def _tensor(shape, **extra):
    return {"T": "tensor", "shape": shape, "dtype": "float32", **extra}


def _run(*, probabilities_from=None, broadcast_from=None, steps=4):
    """Steps of a classifier (cross_entropy on logits, soft targets from a teacher's
    softmax) and a regressor (mse_loss); faults from the given steps on."""
    for step in range(steps):
        given = _tensor([8, 4], probs=True) if probabilities_from is not None and step >= probabilities_from \
            else _tensor([8, 4])
        prediction = _tensor([8, 1] if broadcast_from is not None and step >= broadcast_from else [8])
        yield call_batch(step, [
            {"api": F + "cross_entropy", "args": {"input": given, "target": _tensor([8, 4], probs=True)},
             "ret": _tensor([])},
            {"api": F + "mse_loss", "args": {"input": prediction, "target": _tensor([8])}, "ret": _tensor([])},
            {"api": F + "binary_cross_entropy", "args": {"input": _tensor([8], probs=True), "target": _tensor([8])},
             "ret": _tensor([])},
        ])


def _inferred():
    inferencer = Inferencer(["LossArguments"])
    inferencer.add_trace(_run())
    return inferencer.finish()


def test_only_the_arguments_a_loss_contract_names_are_learned():
    params = sorted((inv.params for inv in _inferred()), key=repr)
    assert params == [
        {"form": "not_probabilities", "api": F + "cross_entropy", "arg": "input"},
        {"form": "same_shape", "api": F + "mse_loss", "arg": "input", "other": "target"},
    ]  # soft targets and binary_cross_entropy's probabilities are never hypotheses
    assert all(inv.precondition is None for inv in _inferred())


def test_probabilities_into_cross_entropy_and_a_broadcast_regression_target_are_reported_at_onset():
    invariants = _inferred()
    by_form = {inv.params["form"]: inv.id for inv in invariants}
    violations = check(invariants, _run(probabilities_from=2, broadcast_from=3))
    assert {(v.step, v.invariant) for v in violations} == {
        (2, by_form["not_probabilities"]), (3, by_form["not_probabilities"]), (3, by_form["same_shape"]),
    }
    assert check(invariants, _run()) == []


def test_parameters_are_validated_and_described():
    template = TEMPLATES["LossArguments"]
    assert template.validate_params({"form": "same_shape", "api": F + "mse_loss", "arg": "input"}) == "other"
    assert template.validate_params({"form": "later", "api": "x", "arg": "y"}) == "form"
    text = template.describe({"form": "not_probabilities", "api": F + "nll_loss", "arg": "input"})
    assert "softmax" in text and "nll_loss" in text
