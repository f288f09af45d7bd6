"""Gradients cleared by hand (``p.grad = None``, ``p.grad.zero_()``) are clears.

Loops without ``torch.optim`` (tutorial-style, d2l-style ``sgd`` helpers) and "faster
zero_grad" recipes clear gradients one parameter at a time.  The producer records one
``torch.Tensor.grad_clear`` per iteration, with the optimizers it cleared entirely, and
the ordering rule "gradients are cleared before each backward" holds on such loops.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import producers
from invariants.events import GRAD_CLEAR_API
from invariants.inference import Inferencer
from invariants.engine import Engine
from invariants.step_windows import StepWindows
from invariants.invariant_set import InvariantSet
from producers.report import read_trace_dir

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

BACKWARD = "torch.Tensor.backward"


def _batches(trace_dir):
    (batches,) = read_trace_dir(trace_dir).values()
    return batches


def _top_level(batches, step):
    return [e["api"] for b in batches if b["step"] == step for e in b["events"]
            if e["kind"] == "call" and e["phase"] == "pre" and e.get("parent") is None]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))


def _hand_loop(trace_dir, clear: str, steps: int = 5, forget_at: int | None = None) -> None:
    with producers.instrument(run_id=f"hand-{clear}", trace_dir=trace_dir):
        model = _model()
        x, y = torch.randn(8, 3), torch.randn(8, 1)
        for step in range(steps):
            ((model(x) - y) ** 2).mean().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.sub_(0.1 * p.grad)
                    if step == forget_at:
                        continue
                    if clear == "none":
                        p.grad = None
                    else:
                        p.grad.zero_()


@pytest.mark.parametrize("clear", ["none", "zero"])
def test_a_hand_clear_is_one_grad_clear_per_iteration_and_ends_it(tmp_path, clear):
    _hand_loop(tmp_path, clear)
    batches = _batches(tmp_path)
    trained = [b["step"] for b in batches if b["events"][-1].get("trained")]
    assert trained == [1, 2, 3, 4, 5]
    for step in (2, 3, 4, 5):  # the clear that ended iteration k is recorded before k+1's backward
        assert _top_level(batches, step) == ["torch.nn.Module.forward", GRAD_CLEAR_API, BACKWARD], step
    clears = [e for b in batches for e in b["events"] if e.get("api") == GRAD_CLEAR_API and e["phase"] == "pre"]
    assert all(e["clears"] == [] for e in clears)  # no optimizer: clears gradients, about none


def test_zero_grad_apis_record_no_hand_clear(tmp_path):
    with producers.instrument(run_id="apis", trace_dir=tmp_path):
        model = _model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            model(torch.randn(4, 3)).sum().backward()
            optimizer.step()
            model.zero_grad()
    apis = {e["api"] for b in _batches(tmp_path) for e in b["events"] if e["kind"] == "call"}
    assert GRAD_CLEAR_API not in apis


def test_a_hand_clear_of_every_parameter_clears_the_optimizer(tmp_path):
    with producers.instrument(run_id="opt", trace_dir=tmp_path):
        model = _model()
        head = nn.Linear(1, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            for p in model.parameters():  # the "faster zero_grad" recipe
                p.grad = None
            head(model(torch.randn(4, 3))).sum().backward()
            optimizer.step()
    clears = [e["clears"] for b in _batches(tmp_path) for e in b["events"]
              if e.get("api") == GRAD_CLEAR_API and e["phase"] == "pre"]
    assert clears[1:] == [["opt0"], ["opt0"]]


def _sequence_rules(batches):
    inferencer = Inferencer(["APISequence"])
    inferencer.add_trace(batches)
    return [i for i in inferencer.finish() if i.params == {"first": "torch.optim.Optimizer.zero_grad",
                                                           "then": BACKWARD}]


def _violations(rules, batches):
    engine = Engine(InvariantSet(rules))
    windows = StepWindows(engine)
    found = []
    for batch in batches:
        found.extend(windows.feed(batch))
    found.extend(windows.finish())
    return found


def test_clears_before_backward_holds_on_hand_loops_and_catches_a_forgotten_clear(tmp_path):
    with producers.instrument(run_id="ref", trace_dir=tmp_path / "ref"):
        model = _model()
        for _ in range(5):
            model.zero_grad()
            model(torch.randn(4, 3)).sum().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.sub_(0.1 * p.grad)
    rules = _sequence_rules(_batches(tmp_path / "ref"))
    assert rules
    for clear in ("none", "zero"):
        _hand_loop(tmp_path / clear, clear)
        assert _violations(rules, _batches(tmp_path / clear)) == [], clear
    _hand_loop(tmp_path / "forgot", "none", forget_at=2)
    assert [v.step for v in _violations(rules, _batches(tmp_path / "forgot"))] == [4]


def test_closing_the_producer_gives_tensor_grad_back_to_torch(tmp_path):
    with producers.instrument(run_id="close", trace_dir=tmp_path):
        assert "grad" in torch.Tensor.__dict__
    assert "grad" not in torch.Tensor.__dict__
    assert type(torch._C.TensorBase.__dict__["grad"]).__name__ == "getset_descriptor"


def test_optimizers_that_each_clear_after_their_own_step_keep_the_clear_before_step_rule(tmp_path):
    """Two optimizers, each cleared right after its own step (the Lightning GAN recipe):
    the window ends after the second step, so the first optimizer's clear sits in the
    previous window; its step says ``cleared`` and the rule holds."""

    def gan(trace_dir, forget_at=None):
        with producers.instrument(run_id="gan", trace_dir=trace_dir):
            torch.manual_seed(0)
            gen, disc = nn.Linear(2, 2), nn.Linear(2, 1)
            opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
            opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3)
            for step in range(6):
                disc(gen(torch.randn(4, 2))).mean().backward()
                opt_g.step()
                if step != forget_at:
                    opt_g.zero_grad()
                disc(gen(torch.randn(4, 2)).detach()).mean().backward()
                opt_d.step()
                opt_d.zero_grad()

    gan(tmp_path / "ref")
    inferencer = Inferencer(["APISequence"])
    inferencer.add_trace(_batches(tmp_path / "ref"))
    rules = [i for i in inferencer.finish() if i.params == {"first": "torch.optim.Optimizer.zero_grad",
                                                           "then": "torch.optim.Optimizer.step"}]
    assert rules and _violations(rules, _batches(tmp_path / "ref")) == []
    gan(tmp_path / "forgot", forget_at=2)
    assert [v.step for v in _violations(rules, _batches(tmp_path / "forgot"))] == [4]


def test_a_first_optimizer_built_under_instrumentation_imports_dynamo_cleanly(tmp_path):
    """Optimizer construction imports torch._dynamo lazily; with ``Tensor.grad`` already
    our property, dynamo's import (torch < 2.13) used to raise. A fresh interpreter, so
    that dynamo is not yet imported."""
    import subprocess
    import sys

    program = (
        "import sys, torch, producers\n"
        "assert 'torch._dynamo' not in sys.modules or torch.__version__ < '2.13'\n"
        f"with producers.instrument(run_id='r-dynamo', trace_dir={str(tmp_path)!r}, quiet=True) as session:\n"
        "    model = torch.nn.Linear(3, 1)\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    import torch._dynamo\n"
        "    model(torch.ones(2, 3)).sum().backward()\n"
        "    optimizer.step()\n"
        "    model.weight.grad = None\n"
        "    assert session.tracer.internal_errors == 0\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("ok")
