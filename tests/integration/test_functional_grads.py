"""A loop that takes its gradients from ``torch.func`` (per-sample gradients under
``vmap`` for DP-SGD) and updates its parameters by hand never calls ``backward``: each
call of a gradient transform counts as one for the iteration tracker, so its iterations
are windows of their own instead of one unchecked run."""

from __future__ import annotations

import torch
from torch import nn

import producers
from tests.support.producer_traces import trace_batches

ITERATIONS = 4


def _run_end(tmp_path) -> dict:
    return next(event for batch in trace_batches(tmp_path) for event in batch["events"]
                if event["kind"] == "meta" and event["what"] == "run_end")


def _train(tmp_path, transform: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    params = {name: param.detach() for name, param in model.named_parameters()}
    with producers.instrument(run_id="r-func", trace_dir=tmp_path, quiet=True) as session:
        def loss_of(weights, x, y):
            out = torch.func.functional_call(model, weights, (x.unsqueeze(0),))
            loss = ((out - y) ** 2).mean()
            return (loss, loss) if transform == "grad_and_value" else loss

        per_sample = torch.func.vmap(getattr(torch.func, transform)(loss_of, has_aux=transform == "grad_and_value"),
                                     in_dims=(None, 0, 0))
        for _ in range(ITERATIONS):
            result = per_sample(params, torch.randn(5, 4), torch.randn(5, 1))
            grads = result[0] if transform == "grad_and_value" else result
            with torch.no_grad():
                for name, tensor in params.items():
                    tensor.sub_(0.1 * grads[name].mean(0))
        assert session.tracer.internal_errors == 0


def test_each_per_sample_gradient_computation_counts_as_an_iteration(tmp_path):
    _train(tmp_path, "grad")
    assert _run_end(tmp_path)["iterations"] == ITERATIONS


def test_grad_and_value_counts_too(tmp_path):
    _train(tmp_path, "grad_and_value")
    assert _run_end(tmp_path)["iterations"] == ITERATIONS


def test_with_an_optimizer_its_steps_alone_end_the_iterations(tmp_path):
    """The torch.func tutorial's DP-SGD with ``torch.optim``: gradients assigned to
    ``p.grad`` after a ``zero_grad``, then ``step()``.  The gradient computation is no
    backward there (the clear after it would end an extra window, and the steps would
    claim a ``Tensor.backward`` that never ran)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with producers.instrument(run_id="r-func-opt", trace_dir=tmp_path, quiet=True):
        def loss_of(weights, x, y):
            return ((torch.func.functional_call(model, weights, (x.unsqueeze(0),)) - y) ** 2).mean()

        per_sample = torch.func.vmap(torch.func.grad(loss_of), in_dims=(None, 0, 0))
        for _ in range(ITERATIONS):
            grads = per_sample({k: v.detach() for k, v in model.named_parameters()},
                               torch.randn(5, 4), torch.randn(5, 1))
            optimizer.zero_grad(set_to_none=True)
            for name, param in model.named_parameters():
                param.grad = grads[name].mean(0)
            optimizer.step()
    assert (_run_end(tmp_path)["iterations"], _run_end(tmp_path)["optimizer_steps"]) == (ITERATIONS, ITERATIONS)
    steps = [event for batch in trace_batches(tmp_path) for event in batch["events"]
             if event["kind"] == "call" and event["api"] == "torch.optim.Optimizer.step" and event["phase"] == "pre"]
    assert steps and all(event["backprop"] is False for event in steps)
