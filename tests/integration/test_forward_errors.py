"""A forward that raises, caught by the program, leaves the producer's bookkeeping whole.

Programs catch errors from a forward (an out-of-memory fallback to a smaller batch, a
probe of an optional input, a generation loop's stop condition), then keep training.
torch calls an always-called global forward hook after such a forward without its
keyword arguments; the producer must close the call and unwind its nesting, or every
later root forward would be recorded as a submodule's.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

import producers
from producers.report import read_trace_dir

FORWARD = "torch.nn.Module.forward"


class Fragile(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.head = nn.Linear(4, 1)
        self.fail_next = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.inner(x)
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("simulated out of memory")
        return self.head(hidden)


def test_a_caught_error_in_forward_is_closed_and_later_forwards_are_roots_again(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with producers.instrument(run_id="r-raise", trace_dir=tmp_path, quiet=True) as session:
            model = Fragile()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in range(4):
                model.fail_next = step == 1
                optimizer.zero_grad()
                try:
                    loss = model(torch.randn(8, 4)).pow(2).mean()
                except RuntimeError:
                    loss = model(torch.randn(4, 4)).pow(2).mean()  # the smaller-batch fallback
                loss.backward()
                optimizer.step()
            errors = session.tracer.internal_errors
            depth = session.tracer._tls.depth
    assert not [w for w in caught if "always_call" in str(w.message)]
    assert errors == 0 and depth == 0
    (batches,) = read_trace_dir(tmp_path).values()
    calls = [e for b in batches for e in b["events"] if e["kind"] == "call" and e["api"] == FORWARD]
    raised = [e for e in calls if e["phase"] == "exc"]
    assert len(raised) == 1 and raised[0]["name"].endswith("Fragile.forward")
    roots = [e for e in calls if e["phase"] == "pre" and e["name"].endswith("Fragile.forward")]
    assert len(roots) == 5 and all(e.get("parent") is None for e in roots)
