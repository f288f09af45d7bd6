"""TorchScript under instrumentation: scripting works, eager calls stay recorded.

``torch.jit.script`` compiles the Python functions a module calls from their source;
with ``torch.nn.functional.dropout`` wrapped it failed on any module using dropout.
"""

from __future__ import annotations

import torch
from torch import nn

import producers
from producers.report import read_trace_dir

DROPOUT = "torch.nn.functional.dropout"


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(8, 16)
        self.dropout = nn.Dropout(0.1)
        self.out = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.dropout(torch.relu(self.hidden(x))))


def test_a_module_with_dropout_scripts_trains_and_eager_dropout_is_still_recorded(tmp_path):
    with producers.instrument(run_id="r-script", trace_dir=tmp_path, quiet=True) as session:
        scripted = torch.jit.script(Net())

        @torch.jit.script
        def scaled(x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.dropout(x, 0.5, False) * 2

        eager = Net()
        optimizer = torch.optim.SGD([*scripted.parameters(), *eager.parameters()], lr=0.1)
        for _ in range(3):
            optimizer.zero_grad()
            x = torch.randn(4, 8)
            (scripted(x).sum() + eager(scaled(x)).sum()).backward()
            optimizer.step()
        errors = session.tracer.internal_errors
    assert errors == 0
    (batches,) = read_trace_dir(tmp_path).values()
    dropouts = [e for b in batches for e in b["events"] if e["kind"] == "call" and e["api"] == DROPOUT]
    assert len([e for e in dropouts if e["phase"] == "pre"]) == 3  # the eager model's, one per step


def _plus_one(x: int) -> int:
    return x + 1


class _Counter:
    """A scripted class calling a module-level function, as torch.distributed.optim's are."""

    def __init__(self, n: int) -> None:
        self.n = _plus_one(n)


def test_a_scripted_class_resolves_names_in_its_callers_frame(tmp_path):
    with producers.instrument(run_id="r-script-class", trace_dir=tmp_path, quiet=True):
        counter = torch.jit.script(_Counter)
        assert counter(1).n == 2
        by_position = torch.jit.script(_Counter, None, 0)
        assert by_position(2).n == 3
