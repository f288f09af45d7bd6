"""`trainwatch collect` end to end: real CPU training in child processes, traces decoded.

Each test starts real Python processes (torch import ~2 s here), so the multi-process
cases are few and tiny.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from invariants.codec import TRACE_MAGIC
from producers.report import read_trace_batches, read_trace_dir, read_trace_summary
from tests.support.teardown import run_program

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def collect(args: list[str], env: dict[str, str], cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_program([sys.executable, "-m", "trainwatch.cli", "collect", *args],
                       env=env, cwd=cwd or ROOT, timeout=timeout)


def states_by(batches: list[dict], at: str) -> dict[int, dict[str, dict]]:
    found: dict[int, dict[str, dict]] = defaultdict(dict)
    for batch in batches:
        for event in batch["events"]:
            if event["kind"] == "state" and event["at"] == at:
                found[batch["step"]][event["name"]] = event["attrs"]
    return found


def calls(batches: list[dict], api: str, phase: str = "pre") -> list[tuple[dict, dict]]:
    return [
        (batch, event)
        for batch in batches
        for event in batch["events"]
        if event["kind"] == "call" and event.get("api") == api and event["phase"] == phase
    ]


def test_single_process_default_trace_dir_frozen_and_trained_parameters(tmp_path, clean_env):
    selection = tmp_path / "apis.txt"
    selection.write_text("# what this test looks at\ntorch.nn.Module.train\ntorch.optim.Optimizer.zero_grad\n")
    result = collect(
        ["--run-id", "single", "-i", str(selection), "--",
         sys.executable, str(EXAMPLES / "mlp.py"), "--steps", "3", "--freeze-first-layer"],
        clean_env, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "mlp: 3 steps" in result.stdout
    trace_dir = tmp_path / "traces" / "single"  # no -o, no --bootstrap: ./traces/<run-id>
    files = read_trace_dir(trace_dir)
    assert len(files) == 1
    (name, batches), = files.items()
    assert name.startswith("single-rank0-pid")
    summary_row = next(line for line in result.stderr.splitlines() if name in line)
    assert summary_row.split()[:1] == ["0"] and summary_row.split()[2] == "3", result.stderr
    assert [b["step"] for b in batches] == [0, 1, 2, 3, 4]
    pre = states_by(batches, "pre:torch.optim.Optimizer.step")
    post = states_by(batches, "post:torch.optim.Optimizer.step")
    for step in range(1, 4):
        assert pre[step]["0.weight"]["data_digest"] == post[step]["0.weight"]["data_digest"]  # frozen
        assert pre[step]["0.weight"]["requires_grad"] is False
        for trained in ("2.weight", "4.weight", "4.bias"):
            assert pre[step][trained]["data_digest"] != post[step][trained]["data_digest"], (step, trained)
    recorded = {e.get("api") for b in batches for e in b["events"] if e["kind"] == "call"}
    assert recorded == {"torch.nn.Module.train", "torch.optim.Optimizer.zero_grad", "torch.optim.Optimizer.step"}
    run_start = batches[0]["events"][1]
    assert run_start["what"] == "run_start" and run_start["argv"][-3:] == ["--steps", "3", "--freeze-first-layer"]


def test_exit_code_passes_through_and_user_sitecustomize_still_runs(tmp_path, clean_env):
    user_site = tmp_path / "usersite"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = 'yes'\n")
    env = dict(clean_env, PYTHONPATH=str(user_site))
    script = "import os, sys; print(os.environ.get('USER_SITE_RAN')); sys.exit(3)"
    result = collect(["-o", str(tmp_path / "t"), "--", sys.executable, "-c", script], env)
    assert result.returncode == 3
    assert result.stdout.strip() == "yes"
    assert "exited with code 3" in result.stderr
    assert list((tmp_path / "t").iterdir()) == [], "a process that never trained leaves no trace"


@pytest.mark.parametrize(
    "args, reason",
    [
        ([], "no training command"),
        (["--bogus", "--", "python", "-c", "pass"], "unrecognized arguments: --bogus"),
        (["-o", "{file}/sub", "--", "python", "-c", "pass"], "not writable"),
        (["-i", "{missing}", "--", "python", "-c", "pass"], "cannot read"),
        (["--bootstrap", "nohost", "--", "python", "-c", "pass"], "is not HOST:PORT"),
        (["--sample-every", "0", "--", "python", "-c", "pass"], "--sample-every"),
        (["-o", "{tmp}/t", "--", "/nonexistent/trainer"], "command not found"),
    ],
    ids=["no-cmd", "unknown-option", "unwritable-dir", "missing-invariants", "bad-bootstrap", "bad-sampling", "missing-cmd"],
)
def test_bad_usage_exits_2_with_one_line(tmp_path, clean_env, args, reason):
    a_file = tmp_path / "file"
    a_file.write_text("")
    args = [a.format(file=a_file, missing=tmp_path / "missing.json", tmp=tmp_path) for a in args]
    result = collect(args, clean_env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and reason in lines[0], result.stderr


def test_torchrun_two_ranks_replicas_agree_until_one_is_perturbed(tmp_path, clean_env):
    perturb_step = 2  # rank 1 nudges a weight right after its 2nd optimizer step
    result = collect(
        ["-o", str(tmp_path), "--run-id", "ddp", "--",
         sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(EXAMPLES / "ddp_gloo.py"), "--steps", "4", "--perturb-rank", "1", "--perturb-step", str(perturb_step)],
        clean_env, timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    traces = read_trace_dir(tmp_path)
    assert len(traces) == 2, "only the two ranks trace (the torchrun launcher does not)"
    by_rank = {batches[0]["rank"]: batches for batches in traces.values()}
    assert set(by_rank) == {0, 1} and all(b["world"] == 2 for bs in by_rank.values() for b in bs)
    pre = {rank: states_by(batches, "pre:torch.optim.Optimizer.step") for rank, batches in by_rank.items()}
    assert set(pre[0]) == set(pre[1]) == {1, 2, 3, 4}
    weight = "module.0.weight"
    for step in range(1, 5):
        names = set(pre[0][step])
        assert weight in names and names == set(pre[1][step])
        same = {n for n in names if pre[0][step][n]["data_digest"] == pre[1][step][n]["data_digest"]}
        if step <= perturb_step:  # iterations are steps 1..N: iteration i is step i + 1
            assert same == names, f"step {step}: replicas must be bitwise equal"
        else:
            assert weight not in same, f"step {step}: the perturbed replica must differ"
            assert same == names - {weight}
    # gradients are all-reduced, so grad digests agree even after the divergence
    assert pre[0][4][weight]["grad_digest"] is not None


def test_spawn_two_ranks_learn_rank_from_init_process_group(tmp_path, clean_env):
    result = collect(
        ["-o", str(tmp_path), "--run-id", "spawn", "--", sys.executable, str(EXAMPLES / "spawn_ddp.py"), "--steps", "2"],
        clean_env, timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    traces = read_trace_dir(tmp_path)
    by_rank = {batches[-1]["rank"]: batches for batches in traces.values()}
    assert set(by_rank) == {0, 1}
    for batches in by_rank.values():
        assert {b["world"] for b in batches} == {2}
        assert [b["step"] for b in batches] == [0, 1, 2, 3]
        assert len(calls(batches, "torch.distributed.init_process_group")) == 1
    step_end = {rank: states_by(batches, "step_end") for rank, batches in by_rank.items()}
    for step in (0, 1, 2):
        assert {n: a["data_digest"] for n, a in step_end[0][step].items()} == {
            n: a["data_digest"] for n, a in step_end[1][step].items()
        }


def test_dataloader_workers_report_their_seeds_once(tmp_path, clean_env):
    result = collect(
        ["-o", str(tmp_path), "--run-id", "dl", "--", sys.executable, str(EXAMPLES / "cnn_bn_dropout.py"),
         "--steps", "3", "--num-workers", "2", "--val-every", "2"],
        clean_env, timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "DataLoader workers: 2 reported their seeds" in result.stderr
    traces = read_trace_dir(tmp_path)
    worker_events = []
    trainer = None
    for batches in traces.values():
        found = calls(batches, "torch.utils.data.worker_init", phase="post")
        if found:
            assert len(batches) == 1 and len(found) == 1, "a worker sends one event, then stays quiet"
            worker_events.extend(found)
        else:
            trainer = batches
    assert trainer is not None and max(b["step"] for b in trainer) == 4
    assert sorted(e["args"]["worker_id"] for _, e in worker_events) == [0, 1]
    assert len({e["args"]["torch_seed"] for _, e in worker_events}) == 2
    assert all(e["args"]["numpy_state_digest"] and e["args"]["python_random_digest"] for _, e in worker_events)
    assert all(b["rank"] == 0 and b["step"] == 0 for b, _ in worker_events)
    # the validation pass is in stage eval with dropout off; training forwards in train
    roots = [e for b in trainer for e in b["events"] if e.get("api") == "torch.nn.Module.forward"
             and e["phase"] == "pre" and e.get("module") == ""]
    assert {e["stage"] for e in roots if e["mtype"] == "SmallCNN"} == {"train", "eval"}
    assert all(e["training"] == (e["stage"] == "train") for e in roots if e["mtype"] == "SmallCNN")


SPAWNED_WORKERS_SCRIPT = """
import torch
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.tensor([float(i * i)])


if __name__ == "__main__":
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(4):
        batches = [torch.randn(4, 1)]
        if step == 2:  # a loader with spawned workers joins the run at step 2
            batches = list(DataLoader(Squares(), batch_size=4, num_workers=2, multiprocessing_context="spawn"))
        for x in batches:
            optimizer.zero_grad()
            model(x).sum().backward()
        optimizer.step()
"""


def test_spawned_dataloader_workers_report_the_step_that_started_them(tmp_path, clean_env):
    script = tmp_path / "spawned_workers.py"
    script.write_text(SPAWNED_WORKERS_SCRIPT)
    traces = tmp_path / "traces"
    result = collect(["-o", str(traces), "--run-id", "spawned", "--", sys.executable, str(script)], clean_env,
                     cwd=tmp_path, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    worker_batches, announcements = [], []
    for batches in read_trace_dir(traces).values():
        if calls(batches, "torch.utils.data.worker_init", phase="post"):
            worker_batches.extend(batches)
        announcements.extend((b["step"], e["workers"]) for b in batches for e in b["events"]
                             if e["kind"] == "meta" and e["what"] == "dataloader_workers")
    # iteration 2 (0-based) is step 3; its first micro-batch's gradients are cleared
    # before any step, so it ends as an iteration of its own (step 3), and step 4 steps
    assert announcements == [(3, 2)]
    assert sorted(b["step"] for b in worker_batches) == [3, 3]  # not step 0: spawn starts a fresh process


def test_killed_training_leaves_a_readable_trace(tmp_path, clean_env):
    from producers.config import ProducerConfig
    from producers.launcher import child_environment

    config = ProducerConfig(run_id="killed", trace_dir=str(tmp_path))
    env = child_environment(config, clean_env)
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "mlp.py"), "--steps", "1000000"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        trace = None
        while time.monotonic() < deadline:
            files = list(tmp_path.glob("*.twtrace"))
            if files and read_trace_summary(files[0]).batches >= 5:
                trace = files[0]
                break
            assert process.poll() is None, "training ended early"
            time.sleep(0.05)
        assert trace is not None, "no batches within 60 s"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    batches = read_trace_batches(trace)
    assert len(batches) >= 5
    assert [b["step"] for b in batches] == list(range(len(batches)))
    # a torn final frame (killed mid-write) is reported and the complete frames survive
    with open(trace, "ab") as stream:
        stream.write(b"\x00\x00\x10\x00partial")
    summary = read_trace_summary(trace)
    assert summary.batches >= len(batches) and "torn tail" in summary.note
    assert trace.read_bytes().startswith(TRACE_MAGIC)


def _free_closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_absent_flags_default_from_trainwatch_environment(tmp_path, clean_env):
    """A deployment exports TRAINWATCH_BOOTSTRAP/RUN_ID/TOPIC_PREFIX once; collect keeps them."""
    bootstrap = f"127.0.0.1:{_free_closed_port()}"
    env = {**clean_env, "TRAINWATCH_BOOTSTRAP": bootstrap, "TRAINWATCH_RUN_ID": "from-env",
           "TRAINWATCH_TOPIC_PREFIX": "team7."}
    show = "import os; print([os.environ.get(k) for k in ('TRAINWATCH_BOOTSTRAP', 'TRAINWATCH_RUN_ID', 'TRAINWATCH_TOPIC_PREFIX')])"
    result = collect(["--flush-timeout", "1", "--", sys.executable, "-c", show], env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str([bootstrap, "from-env", "team7."])
    assert f"kafka: {bootstrap} topic team7.events" in result.stderr
    assert not (tmp_path / "traces").exists()  # a broker is configured: no default trace dir

    # explicit flags still win over the environment
    result = collect(
        ["--run-id", "from-flag", "--topic-prefix", "flag.", "-o", str(tmp_path / "out"), "--",
         sys.executable, "-c", show],
        env, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str([bootstrap, "from-flag", "flag."])
    assert "topic flag.events" in result.stderr
