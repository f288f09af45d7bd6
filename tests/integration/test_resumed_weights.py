"""``resumes_loaded_weights``: an optimizer's first step after a resume steps no parameter
re-initialised since the checkpoint's weights were loaded into it (picotron#32: the
model's initialisation run after ``load_state_dict(..., assign=True)``), nor one the first
training forward rewrote (a data-dependent initialisation whose flag a reload lost,
nflows#4); weights restored outside the forward between the load and the step are fine."""

from __future__ import annotations

import torch
from torch import nn

import producers
from invariants.events import OPTIMIZER_STEP
from tests.support.producer_traces import trace_batches, trace_events


def _verdicts(tmp_path) -> list:
    return [((event.get("ctx") or {}).get("contract") or {}).get("resumes_loaded_weights")
            for _, event in trace_events(trace_batches(tmp_path))
            if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == OPTIMIZER_STEP]


def _steps(model: nn.Module, optimizer: torch.optim.Optimizer, count: int) -> None:
    for _ in range(count):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()


def _resume(tmp_path, *, reinit_after_load: bool, assign: bool = False) -> None:
    torch.manual_seed(0)
    with producers.instrument(run_id="r-resume-weights", trace_dir=tmp_path, quiet=True):
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        _steps(model, optimizer, 2)
        checkpoint = {"model": {k: v.clone() for k, v in model.state_dict().items()},
                      "optimizer": optimizer.state_dict()}
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))  # the restarted job
        model.load_state_dict(checkpoint["model"], assign=assign)
        if reinit_after_load:
            for layer in model:
                if isinstance(layer, nn.Linear):
                    layer.reset_parameters()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        optimizer.load_state_dict(checkpoint["optimizer"])
        _steps(model, optimizer, 2)


def test_weights_re_initialised_after_the_resume_loaded_them_are_reported_at_its_first_step(tmp_path):
    _resume(tmp_path, reinit_after_load=True, assign=True)
    assert _verdicts(tmp_path) == [None, None, False, None]


def test_a_resume_that_keeps_the_loaded_weights_keeps_the_contract(tmp_path):
    _resume(tmp_path, reinit_after_load=False)
    assert _verdicts(tmp_path) == [None, None, True, None]


class _ActNorm(nn.Module):
    """Glow's data-dependent initialisation: scale and shift set from the first training batch."""

    def __init__(self, features: int, flag_in_state_dict: bool) -> None:
        super().__init__()
        self.log_scale = nn.Parameter(torch.zeros(features))
        self.shift = nn.Parameter(torch.zeros(features))
        if flag_in_state_dict:
            self.register_buffer("initialised", torch.tensor(False))
        else:
            self.initialised = False  # nflows#4: lost by a reload

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and not bool(self.initialised):
            with torch.no_grad():
                self.log_scale.data.copy_(-torch.log(x.std(0) + 1e-6))
                self.shift.data.copy_(-x.mean(0) * torch.exp(self.log_scale))
            if isinstance(self.initialised, torch.Tensor):
                self.initialised.fill_(True)
            else:
                self.initialised = True
        return x * torch.exp(self.log_scale) + self.shift


def _resume_flow(tmp_path, *, flag_in_state_dict: bool, restore_between: bool = False) -> None:
    def build() -> nn.Module:
        return nn.Sequential(_ActNorm(4, flag_in_state_dict), nn.Linear(4, 4))

    torch.manual_seed(0)
    with producers.instrument(run_id="r-resume-actnorm", trace_dir=tmp_path, quiet=True):
        model = build()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        _steps(model, optimizer, 3)
        checkpoint = {"model": {k: v.clone() for k, v in model.state_dict().items()},
                      "optimizer": optimizer.state_dict()}
        model = build()  # the restarted job
        model.load_state_dict(checkpoint["model"])
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        optimizer.load_state_dict(checkpoint["optimizer"])
        if restore_between:  # an EMA callback putting other stored weights back before training goes on
            with torch.no_grad():
                model[1].weight.mul_(0.5)
        _steps(model, optimizer, 2)


def test_a_data_dependent_init_rerun_by_the_first_forward_after_the_resume_is_reported(tmp_path):
    _resume_flow(tmp_path / "bug", flag_in_state_dict=False)
    assert _verdicts(tmp_path / "bug") == [None, None, None, False, None]
    _resume_flow(tmp_path / "fixed", flag_in_state_dict=True, restore_between=True)
    assert _verdicts(tmp_path / "fixed") == [None, None, None, True, None]
