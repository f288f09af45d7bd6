"""Optimising inputs through a fixed model is neither training nor evaluation.

Neural style transfer (the PyTorch tutorial), adversarial examples and feature
visualisation put a network in ``eval()`` and optimise a plain tensor through it: its
backward passes and optimizer steps are the loop's own, not an evaluation leaking
gradients.  The producer calls that stage ``inputs``, so the shipped rules about what
evaluation never does do not judge it, while a validation pass of a model an optimizer
trains stays ``eval``."""

from __future__ import annotations

import subprocess
import sys

import torch
from torch import nn

import producers
from invariants.events import OPTIMIZER_STEP
from producers.report import read_trace_dir
from producers.stages import OPTIMIZING_INPUTS


def _features() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1))


def _stages(trace_dir, api: str) -> list[str]:
    (batches,) = read_trace_dir(trace_dir).values()
    return [e["stage"] for b in batches for e in b["events"]
            if e["kind"] == "call" and e["api"] == api and e["phase"] == "pre"]


def test_style_transfer_through_a_frozen_network_is_its_own_stage_and_clean(tmp_path):
    torch.manual_seed(0)
    features = _features().eval().requires_grad_(False)
    content = torch.rand(1, 3, 16, 16)
    target = features(content).detach()
    image = content.clone().requires_grad_(True)
    optimizer = torch.optim.LBFGS([image], max_iter=4)
    with producers.instrument(run_id="r-style", trace_dir=tmp_path, quiet=True):
        for _ in range(6):
            def closure():
                with torch.no_grad():
                    image.clamp_(0, 1)
                optimizer.zero_grad()
                loss = (features(image) - target).pow(2).mean() + 1e-3 * image.pow(2).mean()
                loss.backward()
                return loss
            optimizer.step(closure)
    assert set(_stages(tmp_path, "torch.Tensor.backward")) == {OPTIMIZING_INPUTS}
    assert set(_stages(tmp_path, OPTIMIZER_STEP)) == {OPTIMIZING_INPUTS}
    result = subprocess.run([sys.executable, "-m", "trainwatch.cli", "check", str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_model_an_optimizer_trains_is_evaluated_in_eval_mode(tmp_path):
    torch.manual_seed(0)
    model = _features()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with producers.instrument(run_id="r-eval", trace_dir=tmp_path, quiet=True):
        for _ in range(2):
            model.train()
            optimizer.zero_grad()
            model(torch.rand(2, 3, 8, 8)).mean().backward()
            optimizer.step()
            model.eval()
            with torch.no_grad():
                model(torch.rand(2, 3, 8, 8))
    assert _stages(tmp_path, "torch.nn.Module.forward")[-1] == "eval"


def test_a_backward_for_input_gradients_alone_inside_training_is_no_training_backward(tmp_path):
    """An energy model's training step samples negatives by Langevin dynamics: the model
    in eval(), every parameter frozen, backward for the inputs' gradients.  That backward
    trains nothing (``trained: False``); one reaching trainable parameters is judged."""
    model = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.1), nn.Linear(16, 1))
    with producers.instrument(run_id="r-langevin", trace_dir=tmp_path, quiet=True):
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for frozen in (True, False):
            model.eval()
            model.requires_grad_(not frozen)
            samples = torch.randn(8, 4, requires_grad=True)
            model(samples).sum().backward()
            model.requires_grad_(True)

            def closure():  # Lightning runs the training step inside the optimizer's step
                model.eval()
                model.requires_grad_(not frozen)
                model(torch.randn(8, 4, requires_grad=True)).sum().backward()
                model.requires_grad_(True)
                model.train()
                optimizer.zero_grad()
                loss = model(torch.randn(8, 4)).pow(2).mean()
                loss.backward()
                return loss

            optimizer.step(closure)
    (batches,) = read_trace_dir(tmp_path).values()
    backwards = [e for b in batches for e in b["events"]
                 if e.get("api") == "torch.Tensor.backward" and e.get("phase") == "pre" and e["stage"] == "eval"]
    assert [e.get("trained") for e in backwards] == [False, False, None, None]
