"""Every verdict says what it covered, and a run with nothing to judge is never "OK".

Real runs: small CPU torch programs under `trainwatch collect`, then `trainwatch check`.
Hand-built batches exercise what a real run cannot be made to do on demand (the run
model's flags from producers that set them, lost batches, a violation in a run that
never trained).  The assertions hold for traces of producers with and without the run
model's ``setup``/``trained`` flags.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from invariants.events import make_batch
from invariants.invariant_file import dumps
from invariants.model import Invariant
from tests.support.teardown import run_program
from trainwatch.cli import main
from trainwatch.tracedir import write_trace_dir

ROOT = Path(__file__).resolve().parents[2]
STEPS = 5

TRAIN = f"""
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range({STEPS}):
    x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
"""

# builds a model and only evaluates it: no optimizer step, no backward
EVAL_ONLY = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
model.eval()
with torch.no_grad():
    for _ in range(3):
        model(torch.randn(4, 8))
"""


def trainwatch(*args: str, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess:
    return run_program([sys.executable, "-m", "trainwatch.cli", *args], env=env, cwd=ROOT, timeout=timeout)


def collect(tmp_path: Path, name: str, env: dict[str, str], *command: str) -> Path:
    out = tmp_path / name
    result = trainwatch("collect", "-o", str(out), "--run-id", name, "--", *command, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


@pytest.fixture
def env(clean_env):
    return {**clean_env, "OMP_NUM_THREADS": "1"}


def script(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# -- real runs --------------------------------------------------------------------------
def test_healthy_run_states_its_iterations_and_json_coverage(tmp_path, env):
    trace = collect(tmp_path, "mlp", env, sys.executable, script(tmp_path, "train.py", TRAIN))
    report = tmp_path / "r.json"
    page = tmp_path / "r.html"
    result = trainwatch("check", str(trace), "--report-json", str(report), "--report-html", str(page), env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    verdict = result.stdout.splitlines()[0]
    assert re.fullmatch(rf"OK: no violation in {STEPS} training iterations \(run mlp: rank 0, {STEPS} iterations; "
                        r"setup window checked; (1 window without training checked; )?0 windows unchecked\)",
                        verdict), verdict
    coverage = json.loads(report.read_text())["summary"]["coverage"]
    assert coverage["verdict"] == "ok" and coverage["iterations"] == STEPS
    assert coverage["runs_without_iterations"] == []
    (run,) = coverage["runs"]
    assert run["run"] == "mlp" and run["world"] == 1 and run["optimizer_steps"] == STEPS
    assert run["setup_checked_ranks"] == [0] and run["windows_unchecked"] == 0
    (rank,) = run["ranks"]
    assert rank["rank"] == 0 and rank["iterations"] == STEPS and rank["missing_windows"] == 0
    assert "run mlp: rank 0, 5 iterations; setup window checked" in page.read_text()


def test_ddp_run_states_iterations_per_rank(tmp_path, env):
    trace = collect(tmp_path, "ddp", env, sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                    "examples/ddp_gloo.py", "--steps", "3")
    result = trainwatch("check", str(trace), env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("OK: no violation in 6 training iterations (run ddp: ranks 0-1, "
                                    "3 iterations each; setup window checked; "), result.stdout


def test_run_without_a_training_iteration_exits_two_with_one_line(tmp_path, env):
    trace = collect(tmp_path, "evalonly", env, sys.executable, script(tmp_path, "eval.py", EVAL_ONLY))
    assert list(trace.glob("*.twtrace")), "the evaluation-only process left no trace"
    report = tmp_path / "r.json"
    result = trainwatch("check", str(trace), "--report-json", str(report), env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    assert result.stderr == ("trainwatch check: no training iteration recorded for run evalonly: 0 optimizer steps, "
                             "0 training iterations (setup window checked: no violation)\n")
    coverage = json.loads(report.read_text())["summary"]["coverage"]
    assert coverage["verdict"] == "nothing_checked" and coverage["runs_without_iterations"] == ["evalonly"]


# -- empty input ------------------------------------------------------------------------
def test_directory_of_empty_and_header_only_files_exits_two(tmp_path, capsys):
    from invariants.codec import TRACE_MAGIC

    (tmp_path / "rank0.twtrace").write_bytes(b"")
    (tmp_path / "rank1.twtrace").write_bytes(TRACE_MAGIC)
    assert main(["check", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"trainwatch check: error: {tmp_path}: no batch in 2 trace file(s) (empty or "
                            "header-only): nothing to check\n")


# -- the run model's flags, lost and late input -----------------------------------------
def _event(kind: str, **fields):
    return {"kind": kind, "t": 1, "pid": 7, "tid": 1, "stage": "train", **fields}


def _window(run: str, step: int, *, rank: int = 0, world: int = 1, seq: int, **end_flags):
    """One rank's window in one batch: a backward (no optimizer) and the step end."""
    events = [_event("call", name="torch.Tensor.backward", api="torch.Tensor.backward", phase="pre", cid=step),
              _event("call", name="torch.Tensor.backward", api="torch.Tensor.backward", phase="post", cid=step),
              _event("step", phase="end", **end_flags)]
    return make_batch(run=run, rank=rank, world=world, step=step, seq=seq, events=events)


@pytest.fixture
def ranks_only(tmp_path):
    rules = tmp_path / "ranks.json"
    rules.write_text(dumps([Invariant("AllRanksReport", {})]))
    return str(rules)


def test_loop_boundary_iterations_count_and_losses_are_named(tmp_path, ranks_only, capsys):
    """Iterations marked ``trained`` count without an optimizer step; a sequence gap,
    producer-reported drops, sampled snapshots and run_end counts all appear."""
    start = _event("meta", what="run_start", config={"sample_every": 2})
    setup = make_batch(run="hand", rank=0, world=1, step=0, seq=0,
                       events=[start, _event("step", phase="end", setup=True)])
    stats = _event("meta", what="producer_stats", dropped_batches=3, dropped_events=9)
    end = _event("meta", what="run_end", iterations=5, optimizer_steps=0)
    last = _window("hand", 4, seq=4, trained=True, boundary="close", final=True)
    last["events"][-1:-1] = [stats, end]
    batches = [setup, _window("hand", 1, seq=1, trained=True, boundary="loop"),
               _window("hand", 2, seq=2, trained=True, boundary="loop"),
               # seq 3 (step 3) never arrives
               last]
    write_trace_dir(tmp_path / "t", batches)
    report = tmp_path / "r.json"
    assert main(["check", "-i", ranks_only, str(tmp_path / "t"), "--report-json", str(report)]) == 0
    verdict = capsys.readouterr().out.splitlines()[0]
    assert verdict == ("OK: no violation in 3 training iterations (run hand: rank 0, 3 iterations; setup window "
                       "checked; 0 windows unchecked; 1 batch not checked (lost_batch: 1); producers report 3 "
                       "dropped batches; 1 iteration without parameter snapshots (sampled every 2 steps); "
                       "2 more reported by the producer but not checked)")
    (run,) = json.loads(report.read_text())["summary"]["coverage"]["runs"]
    assert run["lost_batches"] == {"lost_batch": 1} and run["producer_dropped_batches"] == 3
    assert run["optimizer_steps"] == 0 and run["sample_every"] == 2
    assert run["ranks"][0]["reported_iterations"] == 5 and run["ranks"][0]["reported_optimizer_steps"] == 0


def test_missing_rank_and_unfinished_windows_are_unchecked_not_ok(tmp_path, ranks_only, capsys):
    batches = [_window("gap", 0, rank=r, world=2, seq=0, setup=True) for r in (0, 1)]
    batches += [_window("gap", 1, rank=0, world=2, seq=1, trained=True)]  # rank 1 never ends step 1
    batches += [_window("gap", 2, rank=r, world=2, seq=2 - (r == 1), trained=True) for r in (0, 1)]
    tail = _window("gap", 3, rank=0, world=2, seq=3)
    tail["events"].pop()  # the input ends inside step 3
    write_trace_dir(tmp_path / "t", [*batches, tail])
    assert main(["check", "-i", ranks_only, str(tmp_path / "t")]) == 1
    out = capsys.readouterr().out
    assert out.startswith("VIOLATION at step 1 (run gap, ranks [1]")
    assert out.splitlines()[-1] == ("coverage: run gap: ranks 0-1, iterations 2, 1; setup window checked; "
                                    "3 windows unchecked (missing_rank: 1, unfinished: 2)")


def test_violation_in_a_run_that_never_trained_still_exits_one(tmp_path, ranks_only, capsys):
    """Nothing trained, but what was checked failed: that is a violation, not "nothing checked"."""
    write_trace_dir(tmp_path / "t", [_window("setup-only", 0, rank=0, world=2, seq=0, setup=True, final=True)])
    assert main(["check", "-i", ranks_only, str(tmp_path / "t")]) == 1
    captured = capsys.readouterr()
    assert captured.out.startswith("VIOLATION at step 0 (run setup-only, ranks [1]")
    assert "coverage: run setup-only: ranks 0-1, 0 iterations each; setup window checked on rank 0 only; " \
           "1 window unchecked (missing_rank: 1)" in captured.out


# -- watch and serve ----------------------------------------------------------------------
def test_watch_summary_states_coverage_and_a_run_that_never_trained_exits_two(tmp_path, env):
    trained = trainwatch("watch", "--run-id", "w-train", "--", sys.executable, script(tmp_path, "train.py", TRAIN),
                         env=env)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert trained.stderr.strip().splitlines()[-1] == (
        f"trainwatch watch: run w-train: no violation in {STEPS} training iterations (rank 0; setup window checked; "
        "0 windows unchecked); training exited 0")

    idle = trainwatch("watch", "--run-id", "w-eval", "--", sys.executable, script(tmp_path, "eval.py", EVAL_ONLY),
                      env=env)
    assert idle.returncode == 2, idle.stderr[-3000:]
    verdicts = [line for line in idle.stderr.splitlines() if "w-eval" in line and "training exited" in line]
    assert verdicts == ["trainwatch watch: no training iteration recorded for run w-eval: 0 optimizer steps, "
                        "0 training iterations (setup window checked: no violation); training exited 0"]
    kept = re.search(r"logs kept in (\S+)", idle.stderr)
    if kept:
        import shutil

        shutil.rmtree(kept.group(1), ignore_errors=True)


def test_serve_counts_coverage_per_run_and_logs_it_when_ranks_end(ranks_only):
    """The checker's counters and its run-end line, fed the windows a worker closes."""
    from prometheus_client import CollectorRegistry

    from invariants.coverage import window_coverage
    from invariants.engine import Engine
    from invariants.step_windows import StepWindows
    from invariants.invariant_file import load_set
    from stream_checkers.metrics import CheckerMetrics

    registry = CollectorRegistry()
    metrics = CheckerMetrics(registry)
    lines: list[str] = []

    def closed(window):
        line = metrics.coverage.window_closed(window_coverage(window))
        if line:
            lines.append(line)

    windows = StepWindows(Engine(load_set(Path(ranks_only).read_text(), ranks_only)), on_close=closed, grace_steps=1)
    end = _event("meta", what="run_end", iterations=2, optimizer_steps=2)
    for rank in (0, 1):
        windows.feed(_window("live", 0, rank=rank, world=2, seq=0, setup=True))
    for rank in (0, 1):
        windows.feed(_window("live", 1, rank=rank, world=2, seq=1, trained=True, boundary="optimizer"))
    windows.feed(_window("live", 2, rank=0, world=2, seq=2, trained=True, boundary="optimizer"))  # rank 1 never does
    final = [_window("live", 3, rank=rank, world=2, seq=3, final=True) for rank in (0, 1)]
    for batch in final:
        batch["events"].insert(-1, end)
        windows.feed(batch)
    windows.finish()

    def value(name, **labels):
        return registry.get_sample_value(name, {"run": "live", **labels})

    assert value("trainwatch_iterations_checked_total") == 3
    assert value("trainwatch_setup_windows_checked_total") == 2
    assert value("trainwatch_windows_unchecked_total", reason="missing_rank") == 1
    assert value("trainwatch_run_ranks") == 2
    assert lines == ["coverage run=live: ranks 0-1 ended; checked by this worker: run live: ranks 0-1, "
                     "iterations 2, 1; setup window checked; 2 windows without training checked; "
                     "1 window unchecked (missing_rank: 1); 1 more reported by the producer but not checked"]


def test_a_run_that_never_trained_beside_a_healthy_one_is_not_ok(tmp_path, ranks_only, capsys):
    from invariants.synthetic import SyntheticRun

    write_trace_dir(tmp_path / "t", SyntheticRun(run="a", world=1, steps=3).batches(), prefix="a-")
    write_trace_dir(tmp_path / "t", [_window("b", 0, seq=0, setup=True, final=True)], prefix="b-")
    assert main(["check", "-i", ranks_only, str(tmp_path / "t")]) == 2
    captured = capsys.readouterr()
    note, verdict = captured.out.splitlines()[:2]
    assert note.startswith("note: the traces hold 2 runs, checked separately: run a: ")
    assert verdict == ("OK: no violation in 3 training iterations (run a: rank 0, 3 iterations; "
                       "setup window checked; 0 windows unchecked)")
    assert captured.err == ("trainwatch check: no training iteration recorded for run b: 0 optimizer steps, "
                            "0 training iterations (setup window checked: no violation)\n")


def test_uneven_ranks_of_a_large_job_are_summarised_not_listed():
    from invariants.coverage import RankCoverage, RunCoverage
    from invariants.coverage_text import describe_run

    run = RunCoverage("big", world=16, ranks={r: RankCoverage(iterations=60 - (r == 5), setup_checked=True)
                                               for r in range(16)})
    assert describe_run(run) == "run big: ranks 0-15, 59-60 iterations per rank; setup window checked; " \
                                "0 windows unchecked"
    run.ranks = {r: run.ranks[r] for r in (0, 2, 3, 5)}
    assert describe_run(run).startswith("run big: ranks 0,2-3,5, iterations 60, 60, 60, 59; ")


def test_watch_without_the_checkers_counters_says_coverage_is_unknown_and_exits_two():
    """A checker whose /metrics cannot be read leaves nothing saying what was checked."""
    import io
    import shutil

    from stream_checkers.console.watch_session import WatchOptions, WatchSession

    err = io.StringIO()
    session = WatchSession(WatchOptions(command=["true"], run_id="r"), out=io.StringIO(), err=err)
    try:
        assert session._summary(training_rc=0, interrupted=False) == 2
    finally:
        shutil.rmtree(session.workdir, ignore_errors=True)
    assert err.getvalue() == ("trainwatch watch: run r: coverage unknown: the checker's metrics could not be read; "
                              "training exited 0\n")
