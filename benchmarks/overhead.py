"""Producer overhead: instrumented vs plain step time, measured side by side in one run.

For each workload the same model and optimizer are trained in alternating blocks,
plain and under `producers.instrument` (default selective set, trace files to a
temporary directory), so that both see the same machine state.  The ratio of the
median step times is reported per workload, plus the cost of a digest per MB.

    python benchmarks/overhead.py                 # all workloads, default sizes
    python benchmarks/overhead.py --rounds 8 --steps 25 --json out.json

Variants: ``default`` (curated API set, snapshots every step), ``sample10``
(snapshots every 10th step), ``budget5`` (``overhead_budget=0.05``: the producer
picks the snapshot period itself; each block is a new session, so its first 8 steps
snapshot every step before the first adaptation) and ``selective`` (``-i`` the
shipped default invariants: only the APIs and snapshot points they read).

Ratios are of median CPU time of the training thread per step (robust on a shared
machine); wall-clock ratios are printed next to them.  Step times include
everything the producer adds to a step (hooks, wrapped calls,
parameter snapshots with digests and norms, batch encoding and the trace write).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import producers  # noqa: E402
from producers.digest import tensor_digest  # noqa: E402

Step = Callable[[], None]


@dataclass
class Workload:
    name: str
    description: str
    make: Callable[[], Step]


def mlp_step(hidden: int, batch: int) -> Callable[[], Step]:
    def make() -> Step:
        from mlp import build_model

        torch.manual_seed(0)
        model = build_model(16, hidden, 4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()
        inputs, targets = torch.randn(batch, 16), torch.randint(0, 4, (batch,))

        def step() -> None:
            optimizer.zero_grad()
            loss_fn(model(inputs), targets).backward()
            optimizer.step()

        return step

    return make


def cnn_step(batch: int) -> Step:
    from cnn_bn_dropout import SmallCNN

    torch.manual_seed(0)
    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    images, labels = torch.randn(batch, 1, 12, 12), torch.randint(0, 4, (batch,))

    def step() -> None:
        optimizer.zero_grad()
        loss_fn(model(images), labels).backward()
        optimizer.step()

    return step


def transformer_step(dim: int, layers: int, context: int, batch: int) -> Callable[[], Step]:
    def make() -> Step:
        from tiny_transformer_lm import TinyLM, make_batch

        torch.manual_seed(0)
        vocab = 64
        model = TinyLM(vocab, dim, heads=4, layers=layers, context=context)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loss_fn = nn.CrossEntropyLoss()
        tokens, targets = make_batch(batch, context, vocab)

        def step() -> None:
            optimizer.zero_grad(set_to_none=True)
            logits = model(tokens)
            loss_fn(logits.reshape(-1, vocab), targets.reshape(-1)).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()

        return step

    return make


WORKLOADS = [
    Workload("mlp-tiny", "examples/mlp.py defaults (hidden 32, batch 32)", mlp_step(32, 32)),
    Workload("mlp-wide", "examples/mlp.py with hidden 1024, batch 512", mlp_step(1024, 512)),
    Workload("cnn-bn-dropout", "examples/cnn_bn_dropout.py model, batch 64", lambda: cnn_step(64)),
    Workload("transformer-tiny", "examples/tiny_transformer_lm.py defaults (dim 32, 2 layers)", transformer_step(32, 2, 16, 8)),
    Workload("transformer-small", "TinyLM dim 256, 4 layers, context 64, batch 16", transformer_step(256, 4, 64, 16)),
]


def timed_block(step: Step, steps: int) -> list[tuple[float, float]]:
    """(thread CPU seconds, wall seconds) per step.

    CPU time of the training thread is the primary measure: with one intra-op thread
    all of a CPU step runs on it, and unlike wall time it does not move when other
    processes compete for the cores of a shared machine.
    """
    times = []
    for _ in range(steps):
        cpu_start, wall_start = time.thread_time(), time.perf_counter()
        step()
        times.append((time.thread_time() - cpu_start, time.perf_counter() - wall_start))
    return times


def variants(invariants_file: Path | None) -> dict[str, dict[str, object]]:
    """Instrumentation settings compared against plain training."""
    found: dict[str, dict[str, object]] = {"default": {}, "sample10": {"sample_every": 10},
                                           "budget5": {"overhead_budget": 0.05}}
    if invariants_file is not None:
        found["selective"] = {"selection": invariants_file}
    return found


def measure(
    workload: Workload, rounds: int, steps: int, warmup: int, trace_root: Path, settings: dict[str, dict[str, object]]
) -> dict[str, dict[str, float]]:
    step = workload.make()
    for _ in range(warmup):
        step()
    kinds = ["plain", *settings]
    times: dict[str, list[tuple[float, float]]] = {kind: [] for kind in kinds}
    for index in range(rounds):
        # rotate the order so slow drifts of the machine favour no side
        for kind in kinds[index % len(kinds):] + kinds[: index % len(kinds)]:
            if kind == "plain":
                times[kind] += timed_block(step, steps)
                continue
            with producers.instrument(
                run_id=f"bench-{workload.name}-{kind}-{index}", trace_dir=trace_root / workload.name, quiet=True,
                **settings[kind],
            ):
                step()  # the first instrumented step discovers roots and names: not timed
                times[kind] += timed_block(step, steps)

    def medians(kind: str) -> tuple[float, float]:
        return statistics.median(t[0] for t in times[kind]), statistics.median(t[1] for t in times[kind])

    plain_cpu, plain_wall = medians("plain")
    rows = {"plain": {"cpu_ms": plain_cpu * 1e3, "wall_ms": plain_wall * 1e3}}
    for kind in settings:
        cpu, wall = medians(kind)
        rows[kind] = {
            "cpu_ms": cpu * 1e3,
            "wall_ms": wall * 1e3,
            "ratio": cpu / plain_cpu,
            "wall_ratio": wall / plain_wall,
            "added_ms": (cpu - plain_cpu) * 1e3,
        }
    return rows


def digest_cost(megabytes: int, repeats: int) -> dict[str, float]:
    tensor = torch.randn(megabytes * 1024 * 1024 // 4)
    results = {}
    variants: list[tuple[str, torch.Tensor, bool | None]] = [("cpu_xxh3", tensor, False), ("cpu_device_path", tensor, True)]
    if torch.cuda.is_available():
        variants.append(("cuda_device_path", tensor.cuda(), None))
    for name, data, on_device in variants:
        tensor_digest(data, on_device=on_device)  # warm up
        samples = []
        for _ in range(repeats):
            if data.is_cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            tensor_digest(data, on_device=on_device)
            samples.append(time.perf_counter() - start)
        results[f"{name}_ms_per_mb"] = statistics.median(samples) * 1e3 / megabytes
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6, help="alternating plain/instrumented block pairs")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per block")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--only", nargs="*", help="workload names to run")
    parser.add_argument("--digest-mb", type=int, default=64)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    results: dict[str, object] = {"torch": torch.__version__, "threads": torch.get_num_threads(), "workloads": {}}
    with tempfile.TemporaryDirectory(prefix="trainwatch-bench-") as tmp:
        invariants_file = Path(tmp) / "default-invariants.json"
        try:
            from invariants.invariant_file import default_text

            invariants_file.write_text(default_text())
        except ImportError:
            invariants_file = None  # type: ignore[assignment]
        settings = variants(invariants_file)
        for workload in WORKLOADS:
            if args.only and workload.name not in args.only:
                continue
            rows = measure(workload, args.rounds, args.steps, args.warmup, Path(tmp), settings)
            results["workloads"][workload.name] = rows  # type: ignore[index]
            cells = "  ".join(
                f"{kind} x{row['ratio']:.3f} (+{row['added_ms']:.2f} ms; wall x{row['wall_ratio']:.3f})"
                for kind, row in rows.items()
                if kind != "plain"
            )
            print(f"{workload.name:18s} plain {rows['plain']['cpu_ms']:8.2f} ms  {cells}", flush=True)
    digest = digest_cost(args.digest_mb, repeats=5)
    results["digest"] = digest
    print("digest cost: " + ", ".join(f"{k} {v:.3f}" for k, v in digest.items()))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
