"""Inference time vs. trace size, and check throughput, on synthetic DP-shaped traces.

Traces come from `invariants.synthetic.SyntheticRun` (2 ranks; per rank and step a
zero_grad and an optimizer step with parameter snapshots before/after, a forward with
module children, a backward with all-reduces, step-end snapshots, periodic eval
passes and DataLoader worker starts), written as real ``*.twtrace`` files and read
back through `trainwatch.tracedir` — the path ``trainwatch infer/check`` take.

Times are CPU seconds of this process (``time.process_time``): the benchmark machine
is shared, and CPU time is what "per core" means.  Decoding (typed msgpack decoding with
validation) is timed on its own in the same run so the engine's own cost can be
separated from it::

    python benchmarks/infer_check_bench.py                 # 10k, 100k, 1M events
    python benchmarks/infer_check_bench.py --sizes 10000   # quick
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from invariants.engine import Engine  # noqa: E402
from invariants.step_windows import StepWindows
from invariants.wire import wire_types  # noqa: E402
from invariants.inference import Inferencer  # noqa: E402
from invariants.invariant_file import load_default_set  # noqa: E402
from invariants.invariant_set import InvariantSet  # noqa: E402
from invariants.synthetic import SyntheticRun  # noqa: E402
from trainwatch.tracedir import read_trace_dir, write_trace_dir  # noqa: E402

WORLD = 2


def events_per_step() -> int:
    batches = list(SyntheticRun(world=WORLD, steps=6).batches())
    return sum(len(b["events"]) for b in batches) // 6


def write_trace(directory: Path, events: int, seed: int) -> int:
    steps = max(2, events // events_per_step())
    counted = [0]

    def counting(batches):  # streamed: a 1M-event run is never held in memory
        for batch in batches:
            counted[0] += len(batch["events"])
            yield batch

    write_trace_dir(directory, counting(SyntheticRun(run=f"bench-{seed}", world=WORLD, steps=steps, seed=seed).batches()))
    return counted[0]


def cpu(fn) -> tuple[float, object]:
    start = time.process_time()
    result = fn()
    return time.process_time() - start, result


def decode_only(trace: Path) -> int:
    return sum(len(b.events) for b in read_trace_dir(trace, decode=wire_types(None).decode))


def infer_trace(trace: Path) -> list:
    """As ``trainwatch infer`` reads traces: typed batches, every attribute."""
    inferencer = Inferencer()
    inferencer.add_trace(read_trace_dir(trace, decode=wire_types(None).decode))
    return inferencer.finish()


def check_trace(trace: Path, invariant_set: InvariantSet) -> int:
    """As ``trainwatch check`` reads traces: typed batches, the attributes the set keeps."""
    engine = Engine(invariant_set)
    windows = StepWindows.replay(engine)
    found = 0
    for batch in read_trace_dir(trace, decode=wire_types(engine.plan.kept_attrs()).decode):
        found += len(windows.feed(batch))
    return found + len(windows.finish())


def check_batches(batches: list, invariant_set: InvariantSet) -> int:
    windows = StepWindows.replay(Engine(invariant_set))
    found = 0
    for batch in batches:
        found += len(windows.feed(batch))
    return found + len(windows.finish())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000, 1_000_000],
                        help="trace sizes for the inference timing (none: skip it)")
    parser.add_argument("--check-size", type=int, default=100_000)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    results: dict[str, object] = {"inference": [], "check": []}
    with tempfile.TemporaryDirectory(prefix="tw-bench-") as tmp:
        root = Path(tmp)
        for size in args.sizes:
            trace = root / f"infer-{size}"
            events = write_trace(trace, size, seed=1)
            decode_s, _ = cpu(lambda: decode_only(trace))
            total_s, invariants = cpu(lambda: infer_trace(trace))
            row = {"events": events, "decode_cpu_s": round(decode_s, 2), "infer_total_cpu_s": round(total_s, 2),
                   "infer_only_cpu_s": round(total_s - decode_s, 2), "invariants": len(invariants),
                   "events_per_s_total": round(events / total_s)}
            results["inference"].append(row)
            print(f"infer  {events:>9} events: total {total_s:7.2f} s CPU (decode {decode_s:6.2f} s, inference "
                  f"{total_s - decode_s:6.2f} s), {len(invariants)} invariants", flush=True)

        reference = root / "reference"
        write_trace(reference, 20_000, seed=2)
        inferred = InvariantSet(infer_trace(reference))
        trace = root / "check"
        events = write_trace(trace, args.check_size, seed=3)
        decode_s, _ = cpu(lambda: decode_only(trace))
        for name, invariant_set in (("default", load_default_set()), ("inferred", inferred)):
            decoded = list(read_trace_dir(trace, decode=wire_types(invariant_set.plan.kept_attrs()).decode))
            total_s, found = cpu(lambda: check_trace(trace, invariant_set))
            # the engine alone, on batches already decoded in memory (best of 3)
            engine_s = min(cpu(lambda: check_batches(decoded, invariant_set))[0] for _ in range(3))
            row = {"set": name, "invariants": len(invariant_set), "events": events, "violations": found,
                   "total_cpu_s": round(total_s, 2), "decode_cpu_s": round(decode_s, 2),
                   "engine_cpu_s": round(engine_s, 3),
                   "engine_events_per_s": round(events / engine_s), "total_events_per_s": round(events / total_s)}
            results["check"].append(row)
            print(f"check  {events:>9} events, {name:8} set ({len(invariant_set):3} invariants): engine "
                  f"{events / engine_s:10,.0f} events/s, read+decode+check {events / total_s:9,.0f} events/s, "
                  f"{found} violations", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
