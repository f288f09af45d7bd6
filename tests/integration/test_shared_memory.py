"""Two parameters an optimizer holds that are one memory are stepped twice per step:
``load_state_dict(assign=True)`` of a tied checkpoint wraps the shared tensor in a new
``Parameter`` per key (pytorch/pytorch#188346).  ``steps_each_memory_once`` breaks at
the first step of an optimizer over such a model; a tie kept as one parameter, or
restored after loading, and disjoint views of one flat buffer keep it."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import torch
from torch import nn

import producers
from stream_checkers.embedded_broker import free_port
from invariants.events import OPTIMIZER_STEP
from tests.support.producer_traces import trace_batches, trace_events

CONTRACT = "steps_each_memory_once"


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens))


def _verdicts(tmp_path) -> list:
    return [((event.get("ctx") or {}).get("contract") or {}).get(CONTRACT)
            for _, event in trace_events(trace_batches(tmp_path))
            if event["kind"] == "call" and event["phase"] == "pre" and event["api"] == OPTIMIZER_STEP]


def _steps(model: nn.Module, optimizer: torch.optim.Optimizer, count: int) -> None:
    for _ in range(count):
        optimizer.zero_grad()
        model(torch.randint(0, 16, (4, 5))).logsumexp(-1).mean().backward()
        optimizer.step()


def _resume(retie: bool) -> nn.Module:
    buffer = io.BytesIO()
    torch.save(TiedLM().state_dict(), buffer)
    buffer.seek(0)
    with torch.device("meta"):
        model = TiedLM()
    model.load_state_dict(torch.load(buffer), assign=True)
    if retie:
        model.head.weight = model.embed.weight
    return model


def test_a_tied_checkpoint_loaded_with_assign_is_stepped_twice(tmp_path):
    with producers.instrument(run_id="r-shared", trace_dir=tmp_path, quiet=True):
        first = TiedLM()
        _steps(first, torch.optim.AdamW(first.parameters(), lr=1e-2), 2)
        resumed = _resume(retie=False)
        assert resumed.head.weight is not resumed.embed.weight
        assert resumed.head.weight.data_ptr() == resumed.embed.weight.data_ptr()
        _steps(resumed, torch.optim.AdamW(resumed.parameters(), lr=1e-2), 2)
    assert _verdicts(tmp_path) == [True, True, False, False]


def test_a_tie_restored_after_loading_and_views_of_a_flat_buffer_keep_it(tmp_path):
    flat = torch.zeros(24)
    views = [nn.Parameter(flat[:8].view(2, 4)), nn.Parameter(flat[8:].view(4, 4))]
    with producers.instrument(run_id="r-shared-ok", trace_dir=tmp_path, quiet=True):
        resumed = _resume(retie=True)
        _steps(resumed, torch.optim.AdamW(resumed.parameters(), lr=1e-2), 2)
        optimizer = torch.optim.SGD(views, lr=0.1)
        for _ in range(2):
            optimizer.zero_grad()
            (views[0].sum() + views[1].sum()).backward()
            optimizer.step()
    assert _verdicts(tmp_path) == [True] * 4


def test_sharded_parameters_are_judged_by_their_local_shards(tmp_path):
    """FSDP2's ``DTensor`` parameters report address 0 (no storage of their own)."""
    script = tmp_path / "fsdp2_one_rank.py"
    script.write_text(
        "import os, torch, torch.distributed as dist\n"
        "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=os.environ['PORT'], RANK='0', WORLD_SIZE='1')\n"
        "dist.init_process_group('gloo')\n"
        "from torch.distributed.fsdp import fully_shard\n"
        "from producers.shared_memory import SharedMemory\n"
        "model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))\n"
        "fully_shard(model)\n"
        "assert all(p.data_ptr() == 0 for p in model.parameters())\n"
        "print(SharedMemory().steps_each_memory_once(torch.optim.SGD(model.parameters(), lr=0.1)))\n"
        "dist.destroy_process_group()\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PORT": str(free_port())})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "True"
