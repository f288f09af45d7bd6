"""Passes without gradients that keep dropout in training mode: harmless at p = 0, deliberate
in a model no optimizer trains (a Mean Teacher teacher, a target network).

Momentum encoders (MoCo, BYOL) and generation rollouts (policy-gradient fine-tuning of
a language model) run a model in training mode under ``torch.no_grad``. With a dropout
rate of 0, as most large models are configured, that changes nothing; with a real rate
it is the "model.eval() forgotten" mistake the shipped set reports.
"""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
from torch import nn

import producers


def _momentum_training(trace_dir, rate: float, evaluated: str) -> None:
    """An online network trained by SGD and a target network kept by EMA; every step one
    of them (``evaluated``) also runs without gradients, in training mode."""
    with producers.instrument(run_id="r-momentum", trace_dir=trace_dir, quiet=True):
        torch.manual_seed(0)
        online = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Dropout(rate), nn.Linear(16, 4))
        target = copy.deepcopy(online).requires_grad_(False)
        optimizer = torch.optim.SGD(online.parameters(), lr=0.05)
        for _ in range(5):
            x = torch.randn(8, 8)
            with torch.no_grad():
                for mine, theirs in zip(online.parameters(), target.parameters()):
                    theirs.mul_(0.9).add_(mine, alpha=0.1)
                goal = target(x) if evaluated == "target" else online(x).detach() + target(x) * 0
            optimizer.zero_grad()
            (online(x) - goal).pow(2).mean().backward()
            optimizer.step()


@pytest.mark.parametrize("evaluated,rate,expected", [
    ("target", 0.0, 0),  # zero dropout: nothing dropped in either mode
    ("target", 0.3, 0),  # Mean Teacher: a teacher no optimizer trains keeps its noise by design
    ("online", 0.0, 0),
    ("online", 0.3, 1),  # the trained model evaluated without eval(): the mistake
])
def test_training_mode_dropout_without_gradients_is_reported_only_when_it_is_a_mistake(tmp_path, evaluated, rate,
                                                                                      expected):
    _momentum_training(tmp_path, rate, evaluated)
    result = subprocess.run([sys.executable, "-m", "trainwatch.cli", "check", str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == expected, result.stdout + result.stderr
    if expected:
        assert "whenever gradients are disabled" in result.stdout
