"""Inference over a program that builds a new optimizer at each resume.

An optimizer's first step is not judged by the ordering rules (nothing before it left
gradients), so the windows it falls in must not count against how often a
training-loop call occurs: a job resumed twice in eight windows showed
``Optimizer.step`` in too few of the windows that count, and no ordering rule about the
training loop was proposed for any program."""

from __future__ import annotations

import json

import torch
from torch import nn

import producers
from trainwatch.cli import main as trainwatch


def _train_with_resumes(trace_dir) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    with producers.instrument(run_id="r-rebuilt", trace_dir=trace_dir, quiet=True):
        for _ in range(3):  # start, then two resumes: a new optimizer each time
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            for _ in range(2):
                optimizer.zero_grad()
                model(torch.randn(8, 4)).pow(2).mean().backward()
                optimizer.step()


def test_windows_of_first_steps_do_not_thin_out_training_loop_calls(tmp_path):
    _train_with_resumes(tmp_path / "trace")
    output = tmp_path / "inferred.json"
    assert trainwatch(["infer", str(tmp_path / "trace"), "-o", str(output)]) == 0
    descriptions = {inv["description"] for inv in json.loads(output.read_text())["invariants"]}
    assert ("in every step that calls torch.optim.Optimizer.step, torch.optim.Optimizer.zero_grad is called "
            "before it") in descriptions
