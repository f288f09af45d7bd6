"""What one recorded event costs the training thread, measured side by side with plain steps.

    python benchmarks/event_cost.py                       # every workload, default sizes
    python benchmarks/event_cost.py --rounds 8 --steps 40 --only transformer-tiny --json out.json

The same model trains in alternating blocks, plain and under `producers.instrument`
with parameter snapshots switched off (``sample_every`` larger than the run), so the
difference is the event path alone: torch's hooked module-call path, the hooks and
wrappers, argument summaries, the batch's encoding and its write.  The events of each
instrumented block are counted from the recorder, and the added CPU time of the
training thread per step (median of the blocks' steps) is divided by the events per
step.  `benchmarks/overhead.py` gives the whole-step ratios with snapshots.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import WORKLOADS, Step, Workload  # noqa: E402  (also puts the repo on sys.path)

import producers  # noqa: E402

#: the toy workloads, whose short steps make the event path the whole overhead
DEFAULT_WORKLOADS = ("mlp-tiny", "cnn-bn-dropout", "transformer-tiny")
NO_SNAPSHOTS = 1 << 30


def cpu_per_step(step: Step, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        start = time.thread_time()
        step()
        times.append(time.thread_time() - start)
    return times


def measure(workload: Workload, rounds: int, steps: int, warmup: int, trace_root: Path) -> dict[str, float]:
    step = workload.make()
    for _ in range(warmup):
        step()
    plain: list[float] = []
    instrumented: list[float] = []
    events = recorded_steps = 0
    for index in range(rounds):
        order = ("plain", "instrumented") if index % 2 == 0 else ("instrumented", "plain")
        for kind in order:
            if kind == "plain":
                plain += cpu_per_step(step, steps)
                continue
            with producers.instrument(run_id=f"events-{workload.name}-{index}", trace_dir=trace_root / workload.name,
                                      quiet=True, sample_every=NO_SNAPSHOTS) as session:
                step()  # discovers roots and names: not timed
                counters = session.recorder
                before = counters.counters.events + counters.pending
                instrumented += cpu_per_step(step, steps)
                events += counters.counters.events + counters.pending - before
                recorded_steps += steps
    plain_ms = statistics.median(plain) * 1e3
    instrumented_ms = statistics.median(instrumented) * 1e3
    per_step = events / recorded_steps
    return {"plain_ms": plain_ms, "instrumented_ms": instrumented_ms, "events_per_step": per_step,
            "added_ms": instrumented_ms - plain_ms, "us_per_event": (instrumented_ms - plain_ms) * 1e3 / per_step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6, help="alternating plain/instrumented block pairs")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per block")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--only", nargs="*", default=list(DEFAULT_WORKLOADS), help="workload names to run")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    unknown = set(args.only) - {workload.name for workload in WORKLOADS}
    if unknown:
        parser.error(f"unknown workload(s): {', '.join(sorted(unknown))}")
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="trainwatch-events-") as tmp:
        for workload in WORKLOADS:
            if workload.name not in args.only:
                continue
            row = measure(workload, args.rounds, args.steps, args.warmup, Path(tmp))
            results[workload.name] = row
            print(f"{workload.name:18s} plain {row['plain_ms']:7.3f} ms  instrumented {row['instrumented_ms']:7.3f} ms  "
                  f"{row['events_per_step']:5.1f} events/step  {row['us_per_event']:5.2f} us/event", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"torch": torch.__version__, "workloads": results}, indent=2))


if __name__ == "__main__":
    main()
