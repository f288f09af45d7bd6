"""A squared error written by hand on a ``(B, 1)`` prediction and a ``(B,)`` target
broadcasts to ``(B, B)``: the backward of that loss breaks ``compares_like_shapes``.
Matching shapes, pairwise matrices built on purpose (ranking, contrastive losses),
torch's own losses and non-scalar backwards keep it or are not judged."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import producers
from invariants.events import TENSOR_BACKWARD
from producers.loss_shapes import produced_shape
from tests.support.producer_traces import trace_batches, trace_events

BATCH = 8


def _verdicts(tmp_path) -> list:
    contracts = [(event.get("ctx") or {}).get("contract") or {} for _, event in trace_events(trace_batches(tmp_path))
                 if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == TENSOR_BACKWARD]
    return [contract.get("compares_like_shapes", "absent") for contract in contracts]


def _train(tmp_path, loss_of, steps: int = 3) -> list:
    """``loss_of(model(x), x, target)`` for a regression head with one output."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with producers.instrument(run_id="r-shapes", trace_dir=tmp_path, quiet=True):
        for _ in range(steps):
            x, target = torch.randn(BATCH, 4), torch.randn(BATCH)
            optimizer.zero_grad()
            loss_of(model(x), x, target).backward()
            optimizer.step()
    return _verdicts(tmp_path)


def test_the_autograd_graph_gives_the_shape_each_node_produced():
    """The private attribute the contract reads (`Node._input_metadata`)."""
    column = nn.Linear(4, 1)(torch.randn(BATCH, 4))
    difference = column - torch.randn(BATCH)
    assert produced_shape(difference.grad_fn, 0) == (BATCH, BATCH)
    assert produced_shape(column.grad_fn, 0) == (BATCH, 1)


@pytest.mark.parametrize("loss_of", [
    lambda pred, x, y: ((pred - y) ** 2).mean(),
    lambda pred, x, y: F.cross_entropy(torch.randn(BATCH, 3, requires_grad=True), torch.zeros(BATCH).long())
    + 0.5 * (pred - y).abs().mean(),
    lambda pred, x, y: 0.5 * (y - pred).pow(2).sum() / BATCH,
], ids=["squared", "auxiliary_l1", "target_first"])
def test_a_column_prediction_against_a_vector_target_breaks_the_contract(tmp_path, loss_of):
    assert _train(tmp_path, loss_of) == [False] * 3


@pytest.mark.parametrize("loss_of", [
    lambda pred, x, y: ((pred.squeeze(-1) - y) ** 2).mean(),
    lambda pred, x, y: ((pred - y.unsqueeze(1)) ** 2).mean(),
    lambda pred, x, y: F.mse_loss(pred.squeeze(-1), y),
    # a margin ranking loss over every pair, the pair matrix built on purpose
    lambda pred, x, y: F.relu(1 - (pred[:, None, 0] - pred[None, :, 0]) * torch.sign(y[:, None] - y[None, :])).mean(),
    # softmax-normalised similarities: a (B, 1) maximum subtracted from a (B, B) matrix
    lambda pred, x, y: (lambda sim: (sim - sim.max(1, keepdim=True).values).logsumexp(1).mean())(pred @ pred.T),
], ids=["squeezed", "target_unsqueezed", "library_loss", "pairwise_ranking", "similarity_matrix"])
def test_like_shapes_and_deliberate_pair_matrices_keep_it(tmp_path, loss_of):
    assert _train(tmp_path, loss_of) == [True] * 3


def test_a_backward_from_a_non_scalar_output_is_not_judged(tmp_path):
    def loss_of(pred, x, y):
        return pred - y  # (B, B), backed with a given gradient below

    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    with producers.instrument(run_id="r-shapes", trace_dir=tmp_path, quiet=True):
        out = loss_of(model(torch.randn(BATCH, 4)), None, torch.randn(BATCH))
        out.backward(torch.ones_like(out))
    assert _verdicts(tmp_path) == ["absent"]
