"""Mixed precision lost mid-run, seen in real training: the producer says which model a
forward runs in, and StablePrecision, learned from a healthy run that mixes precisions
on purpose (a float32 dry run at setup, the loss outside autocast, a layer forced to
float32, float32 evaluation), reports only the runs whose training lost autocast."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

import producers
from invariants.inference import Inferencer
from tests.support.producer_traces import trace_batches
from tests.support.relation_batches import check

STEPS = 8


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 16))
        self.act = nn.GELU()
        self.head = nn.Linear(16, 1)
        self.lose_autocast_in_body = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.body(x)
        if self.lose_autocast_in_body:  # a kernel that drops the autocast transformation
            hidden = hidden.float()
        hidden = self.act(hidden)
        with torch.autocast("cpu", enabled=False):  # a head kept in float32 on purpose
            return self.head(hidden.float())


def _run(trace_dir: Path, *, drop_autocast_at: int | None = None, partial_at: int | None = None) -> list[dict]:
    torch.manual_seed(0)
    model = _Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with producers.instrument(run_id=trace_dir.name, trace_dir=trace_dir, quiet=True):
        model(torch.zeros(2, 4))  # a dry run at setup, before autocast is configured
        for step in range(STEPS):
            model.lose_autocast_in_body = partial_at is not None and step >= partial_at
            amp = drop_autocast_at is None or step < drop_autocast_at
            x, y = torch.randn(16, 4), torch.randn(16, 1)
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                out = model(x)
            F.mse_loss(out.float(), y).backward()  # the loss outside autocast
            optimizer.step()
            if step % 3 == 2:
                model.eval()
                with torch.no_grad():  # evaluation in float32
                    model(torch.randn(16, 4))
                model.train()
    return trace_batches(trace_dir)


def _learned(tmp_path: Path):
    inferencer = Inferencer(["StablePrecision"])
    inferencer.add_trace(_run(tmp_path / "healthy"))
    invariants = inferencer.finish()
    assert [inv.relation for inv in invariants] == ["StablePrecision"]
    return invariants


def test_forwards_name_the_model_they_run_in(tmp_path):
    batches = _run(tmp_path / "ids")
    forwards = [e for b in batches for e in b["events"]
                if e["kind"] == "call" and e["phase"] == "pre" and e.get("api") == "torch.nn.Module.forward"]
    assert forwards and {e.get("obj") for e in forwards} == {"m0"}


def test_a_healthy_run_mixing_precisions_on_purpose_is_clean(tmp_path):
    invariants = _learned(tmp_path)
    assert check(invariants, _run(tmp_path / "again")) == []


def test_autocast_dropped_partway_is_reported_at_the_step_it_was_dropped(tmp_path):
    invariants = _learned(tmp_path)
    violations = check(invariants, _run(tmp_path / "dropped", drop_autocast_at=5))
    # step 0 is the setup window, the loop's step k is window k + 1; one change, one report
    assert [v.step for v in violations] == [6]
    first = violations[0].evidence["first"]
    assert first["previous_iteration"] == ["bfloat16"] and first["dtypes"] == ["float32"]


def test_one_layer_losing_autocast_is_reported_by_name(tmp_path):
    invariants = _learned(tmp_path)
    violations = check(invariants, _run(tmp_path / "partial", partial_at=4))
    assert [v.step for v in violations] == [5]
    assert violations[0].evidence["first"]["module"] == "act"
