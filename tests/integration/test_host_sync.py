"""No host read of a device result in the step path: snapshots defer their readback.

There is no accelerator here, so `producers.readback.FORCE_DEFERRED` sends CPU tensors
down the device path (device digests, results gathered and read back later).  Every
host-reading tensor method is counted when producer code calls it; the only reader
allowed is `Readback.resolve`, which reads the host copy at a later step boundary.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import producers
from producers import readback
from producers.digest import tensor_digests
from producers.param_snapshots import tensor_norms
from producers.report import read_trace_dir

PRODUCERS = str(Path(producers.__file__).parent)
HOST_READS = ("tolist", "item", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__")
STEP = "torch.optim.Optimizer.step"


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.b.weight = self.a.weight  # one parameter under two names
        self.out = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.b(torch.relu(self.a(x)))))


@pytest.fixture
def host_reads(monkeypatch):
    """(method, file, line) of every host read made directly by producer code, outside resolution."""
    reads: list[tuple[str, str, int]] = []
    resolving = [False]

    def counted(name, original):
        def read(self, *args, **kwargs):
            caller = sys._getframe(1)
            # summarize_tensor reads the value of CPU scalars only (the loss), never a device's
            if caller.f_code.co_filename.startswith(PRODUCERS) and not resolving[0] \
                    and caller.f_code.co_name != "summarize_tensor":
                reads.append((name, caller.f_code.co_filename, caller.f_lineno))
            return original(self, *args, **kwargs)
        return read

    for name in HOST_READS:
        monkeypatch.setattr(torch.Tensor, name, counted(name, getattr(torch.Tensor, name)))
    resolve = readback.Readback.resolve

    def resolve_counted(self):
        resolving[0] = True
        try:
            resolve(self)
        finally:
            resolving[0] = False

    monkeypatch.setattr(readback.Readback, "resolve", resolve_counted)
    monkeypatch.setattr(readback, "FORCE_DEFERRED", True)
    return reads


def _train(model, steps, on_step=lambda: None):
    """SGD steps; returns per step the gradients before and the parameters after the update."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        optimizer.step()
        seen.append((grads, {n: p.detach().clone() for n, p in model.named_parameters()}))
        on_step()
    return seen


def _states(batches, at):
    found: dict[int, dict[str, dict]] = {}
    for batch in batches:
        for event in batch["events"]:
            if event["kind"] == "state" and event["at"] == at:
                found.setdefault(batch["step"], {})[event["name"]] = event["attrs"]
    return found


def _expected(tensor):
    """What the immediate device path reads for one tensor."""
    return tensor_digests([tensor], on_device=True)[0], tensor_norms([tensor])[0]


def test_the_step_path_reads_nothing_back_and_deferral_changes_no_value(tmp_path, host_reads):
    torch.manual_seed(0)
    with producers.instrument(run_id="r-sync", trace_dir=tmp_path, quiet=True):
        model = Tied()
        seen = _train(model, steps=4)
    assert host_reads == [], host_reads
    (batches,) = read_trace_dir(tmp_path).values()
    pre, post = _states(batches, f"pre:{STEP}"), _states(batches, f"post:{STEP}")
    assert sorted(pre) == sorted(post) == [1, 2, 3, 4]
    for step, (grads, params) in enumerate(seen, start=1):
        assert set(post[step]) == {"a.weight", "a.bias", "b.weight", "b.bias", "out.weight", "out.bias"}
        for name, attrs in post[step].items():
            source = "a.weight" if name == "b.weight" else name
            assert (attrs["data_digest"], attrs["data_norm"]) == _expected(params[source]), (step, name)
            assert attrs["data_digest"].startswith("dv:")
            assert attrs["data_norm"] == pytest.approx(float(torch.linalg.vector_norm(params[source])))
            assert (pre[step][name]["grad_digest"], pre[step][name]["grad_norm"]) == _expected(grads[source])


def test_the_immediate_path_is_what_the_counter_catches(tmp_path, host_reads, monkeypatch):
    monkeypatch.setattr(readback, "IMMEDIATE", True)
    with producers.instrument(run_id="r-sync-control", trace_dir=tmp_path, quiet=True):
        _train(Tied(), steps=2)
    assert {name for name, _, _ in host_reads} >= {"tolist"}


def test_a_step_ships_by_the_next_step_end_and_close_ships_everything(tmp_path, host_reads, monkeypatch):
    # copies that never land by themselves: only a step boundary's wait releases them
    monkeypatch.setattr(readback._Landed, "query", lambda self: False)
    shipped_by_then: list[tuple[int, set[int]]] = []
    with producers.instrument(run_id="r-sync-late", trace_dir=tmp_path, quiet=True) as session:
        def note() -> None:
            files = read_trace_dir(tmp_path)
            steps = {b["step"] for b in next(iter(files.values()), [])}
            shipped_by_then.append((session.recorder.step, steps))

        torch.manual_seed(1)
        _train(Tied(), steps=5, on_step=note)
    assert host_reads == [], host_reads
    for ended, steps in shipped_by_then[1:]:
        # every step but the last one ended is out; that one waits for its values
        assert set(range(ended - 1)) <= steps and ended - 1 not in steps, (ended, steps)
    (batches,) = read_trace_dir(tmp_path).values()
    assert [b["seq"] for b in batches] == list(range(len(batches)))
    assert [b["step"] for b in batches] == sorted(b["step"] for b in batches)
    assert {b["step"] for b in batches} == set(range(batches[-1]["step"] + 1))
    states = [e for b in batches for e in b["events"] if e["kind"] == "state"]
    assert states and all(e["attrs"]["grad_norm"] is not None for e in states if e["attrs"]["grad_digest"])
    for event in states:
        if "data_digest" in event["attrs"]:
            assert event["attrs"]["data_digest"] and event["attrs"]["data_norm"] is not None, event
    zero_grad = _states(batches, "pre:torch.optim.Optimizer.zero_grad")
    reused = [a for step in zero_grad.values() for a in step.values() if a["grad_digest"] is not None]
    assert reused and all(a["grad_norm"] is not None for a in reused), "memo entries resolved too"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_no_synchronising_cuda_call_in_the_steps_of_a_traced_loop(tmp_path):
    import warnings

    with producers.instrument(run_id="r-sync-cuda", trace_dir=tmp_path, quiet=True) as session:
        model = Tied().cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(8, 4, device="cuda")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for step in range(6):
                torch.cuda.set_sync_debug_mode("warn" if step else 0)  # step 0 finds the model
                optimizer.zero_grad()
                model(x).pow(2).mean().backward()
                optimizer.step()
            torch.cuda.set_sync_debug_mode(0)
        errors = session.tracer.internal_errors
    assert [str(w.message) for w in caught if "called a synchronizing" in str(w.message)] == []
    assert errors == 0
    (batches,) = read_trace_dir(tmp_path).values()
    post = _states(batches, f"post:{STEP}")
    final = post[max(post)]
    for name, param in model.named_parameters():
        assert (final[name]["data_digest"], final[name]["data_norm"]) == _expected(param.detach()), name


def _synchronising_calls(model: nn.Module, steps: int) -> list[str]:
    """Messages of the synchronising CUDA calls a classification loop makes after its first step."""
    import warnings

    from torch.nn import functional as F

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4, device="cuda"), torch.randint(0, 3, (8,), device="cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(steps):
            torch.cuda.set_sync_debug_mode("warn" if step else 0)
            optimizer.zero_grad()
            logits = model(x)
            loss = F.cross_entropy(logits, y) + F.mse_loss(torch.sigmoid(logits), torch.zeros_like(logits))
            loss.backward()
            optimizer.step()
        torch.cuda.set_sync_debug_mode(0)
    return [str(w.message) for w in caught if "called a synchronizing" in str(w.message)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_recorded_losses_marked_probabilities_and_an_overhead_budget_add_no_synchronising_call(tmp_path):
    def classifier() -> nn.Module:
        return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).cuda()

    plain = _synchronising_calls(classifier(), steps=12)  # torch's own, if any
    with producers.instrument(run_id="r-sync-loss", trace_dir=tmp_path, quiet=True, overhead_budget=0.05) as session:
        traced = _synchronising_calls(classifier(), steps=12)
        errors = session.tracer.internal_errors
    assert traced == plain and errors == 0
    (batches,) = read_trace_dir(tmp_path).values()
    losses = [e for b in batches for e in b["events"]
              if e["kind"] == "call" and e["phase"] == "pre" and e["api"].endswith(("cross_entropy", "mse_loss"))]
    assert len(losses) == 24 and all(e["args"]["input"]["device"].startswith("cuda") for e in losses)
    assert [bool(e["args"]["input"].get("probs")) for e in losses[:2]] == [False, True]
