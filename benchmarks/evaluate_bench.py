"""CPU cost of window evaluation (`Engine.evaluate`) per event, with the shipped default set.

A streaming worker folds each batch into its step window and, when every rank has
reported, evaluates the closed window against every deployed invariant.  This
measures the evaluation alone: windows are folded first (as the worker does,
through `EnginePort`), then each closed window is evaluated ``--repeat`` times on
a fresh copy of the run state, and the best total is kept (CPU time of this thread,
so other jobs on the machine count as little as possible).  The figure is
microseconds of evaluation per *event* folded into the windows, the unit the
worker's throughput target is stated in.

Workloads: `invariants.synthetic.SyntheticRun`, one batch per rank and step, 2 ranks,
with 0/40/160 extra linear layers (``healthy``), and the same run with silent bugs
injected from step 2 on (``buggy``: replica drift, a frozen parameter, no zero_grad,
autocast lost, untied weights, dropout left on in evaluation, a repeated worker seed)
so that violations, their evidence and lazily built precondition records are paid for.

Usage::

    python benchmarks/evaluate_bench.py [--steps 40] [--layers 0 40 160] [--repeat 7] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import copy
import gc
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from invariants.synthetic import Fault, SyntheticRun  # noqa: E402
from stream_checkers.engine_port import EnginePort  # noqa: E402

BUGS = (Fault("drift", 2, 1), Fault("frozen", 2, 0), Fault("no_zero_grad", 3, 1), Fault("autocast_lost", 2, 1),
        Fault("untie", 2, 0), Fault("dropout_in_eval", 3, 0), Fault("same_worker_seed", 3, 1))


def closed_windows(port: EnginePort, run: SyntheticRun) -> tuple[list, int]:
    """Windows in the order they complete, and the number of events folded into them."""
    open_windows: dict[int, object] = {}
    closed, events = [], 0
    for batch in run.batches():
        step = batch["step"]
        window = open_windows.get(step)
        if window is None:
            window = open_windows[step] = port.open(run.run, step)
        port.add(window, batch)
        events += len(batch["events"])
        if port.complete(window):
            closed.append(open_windows.pop(step))
    if open_windows:
        raise RuntimeError(f"windows never completed: {sorted(open_windows)}")
    return closed, events


def evaluate_all(port: EnginePort, run: str, windows: list) -> tuple[float, int]:
    """CPU seconds to evaluate every window in order (as one run), and violations found."""
    state = port.new_run_state(run)
    clock = time.thread_time
    spent, violations = 0.0, 0
    for window in windows:
        start = clock()
        violations += len(port.engine.evaluate(window, state))
        spent += clock() - start
    return spent, violations


def measure(port: EnginePort, name: str, run: SyntheticRun, repeat: int) -> dict:
    windows, events = closed_windows(port, run)
    best, violations = float("inf"), 0
    for _ in range(repeat):
        copies = copy.deepcopy(windows)  # evaluation must not depend on an earlier pass
        gc.collect()
        spent, violations = evaluate_all(port, run.run, copies)
        best = min(best, spent)
    return {"workload": name, "layers": run.extra_layers, "windows": len(windows),
            "events_per_window": round(events / len(windows)), "violations": violations,
            "us_per_event": best / events * 1e6, "us_per_window": best / len(windows) * 1e6}


def workloads(steps: int, layers: list[int]) -> list[tuple[str, SyntheticRun]]:
    out = []
    for n in layers:
        out.append(("healthy", SyntheticRun(run=f"healthy-{n}", steps=steps, extra_layers=n, split_steps=False)))
        out.append(("buggy", SyntheticRun(run=f"buggy-{n}", steps=steps, extra_layers=n, split_steps=False,
                                          faults=list(BUGS))))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="steps per run (2 ranks)")
    parser.add_argument("--layers", type=int, nargs="+", default=[0, 40, 160])
    parser.add_argument("--repeat", type=int, default=7, help="passes per workload; the best is reported")
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one pass per workload")
    args = parser.parse_args()
    port = EnginePort.load(None)
    print(f"default set: {port.invariant_count} invariants; best of {args.repeat} passes, thread CPU time")
    print(f"{'workload':<9}{'layers':>7}{'windows':>8}{'events/win':>11}{'violations':>11}"
          f"{'us/event':>10}{'us/window':>11}")
    for name, run in workloads(args.steps, args.layers):
        row = measure(port, name, run, args.repeat)
        print(f"{row['workload']:<9}{row['layers']:>7}{row['windows']:>8}{row['events_per_window']:>11}"
              f"{row['violations']:>11}{row['us_per_event']:>10.3f}{row['us_per_window']:>11.1f}", flush=True)
        if args.profile:
            windows, _ = closed_windows(port, run)
            profiler = cProfile.Profile()
            profiler.enable()
            evaluate_all(port, run.run, windows)
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(14)
    return 0


if __name__ == "__main__":
    sys.exit(main())
