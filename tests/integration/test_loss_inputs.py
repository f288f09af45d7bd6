"""What the producer says about the tensors a loss is given: softmax and sigmoid outputs,
however spelt, are marked as probabilities; everything else, log_softmax included, is
not; the wrappers leave torch as it was once the session ends."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

import producers
from producers.selection import LOSS_FUNCTIONS
from tests.support.producer_traces import trace_batches, trace_events


def _loss_inputs(tmp_path) -> list[tuple[str, dict]]:
    return [(event["api"].rsplit(".", 1)[1], event["args"]) for _, event in trace_events(trace_batches(tmp_path))
            if event["kind"] == "call" and event["phase"] == "pre" and event["api"] in LOSS_FUNCTIONS]


def test_probabilities_reaching_a_loss_are_marked_whichever_way_they_were_made(tmp_path):
    originals = (F.softmax, torch.sigmoid, torch.Tensor.softmax)
    head = nn.Linear(3, 4)
    labels = torch.tensor([0, 1, 2, 3])
    with producers.instrument(run_id="r-loss", trace_dir=tmp_path):
        logits = head(torch.randn(4, 3))
        F.cross_entropy(logits, labels)  # raw scores
        F.cross_entropy(nn.Softmax(dim=1)(logits), labels)  # the double softmax
        F.cross_entropy(logits.softmax(-1), labels)
        F.nll_loss(F.log_softmax(logits, dim=1), labels)  # log-probabilities are fine
        F.binary_cross_entropy_with_logits(torch.sigmoid(logits), torch.ones(4, 4))
        F.mse_loss(logits[:, :1], torch.zeros(4))  # broadcasts (4, 1) against (4,)
        with torch.no_grad():  # probabilities edited in place into log-probabilities
            F.nll_loss(logits.softmax(-1).clamp_(min=1e-8).log_(), labels)
    assert (F.softmax, torch.sigmoid, torch.Tensor.softmax) == originals
    calls = _loss_inputs(tmp_path)
    given = [(name, bool(args["input"].get("probs"))) for name, args in calls]
    assert given == [("cross_entropy", False), ("cross_entropy", True), ("cross_entropy", True),
                     ("nll_loss", False), ("binary_cross_entropy_with_logits", True), ("mse_loss", False),
                     ("nll_loss", False)]
    assert calls[5][1]["input"]["shape"] == [4, 1] and calls[5][1]["target"]["shape"] == [4]

