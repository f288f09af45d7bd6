"""Host synchronisations per training step on a CUDA device: plain, producer, producer reading back at once.

    python benchmarks/host_sync_gpu.py --steps 200

An 8-layer MLP (2048 wide, AdamW, inputs on the device, no ``.item()`` in the loop) is
trained four ways: ``plain``; ``deferred``, under `producers.instrument` (trace files
in a temporary directory) with snapshot results read back at a later step boundary;
``torch-ops``, the same with digests by torch ops instead of the fused CUDA kernel;
``immediate``, the same with ``TRAINWATCH_IMMEDIATE_READBACK`` behaviour (every
snapshot reads its norms and digests back at once).  During the measured steps
``torch.cuda.set_sync_debug_mode("warn")`` turns each synchronising CUDA call into a
warning, which is counted; the device is synchronised only after the last step.

Look for: ``deferred`` with 0.00 syncs/step (``immediate`` shows several per step),
``event waits/step`` (step boundaries that found the previous step's copy not yet
landed; a wait there is not a device-wide sync), and its ms/step close to ``plain``.
The check line at the end compares the traced values with an immediate read.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import producers  # noqa: E402
from producers import digest_kernel, readback  # noqa: E402
from producers.digest import tensor_digests  # noqa: E402
from producers.report import read_trace_dir  # noqa: E402


def build(width: int, layers: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.GELU()]
    model = nn.Sequential(*blocks, nn.Linear(width, 1)).cuda()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def train(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, steps: int) -> list[float]:
    """Host-side seconds per step (enqueue time; a blocking read shows up here)."""
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return times


def measure(mode: str, args: argparse.Namespace, trace_root: Path) -> dict[str, object]:
    x = torch.randn(args.batch, args.width, device="cuda")
    y = torch.randn(args.batch, 1, device="cuda")
    waits = [0]
    resolve = readback.Readback.resolve

    def counted_resolve(self: readback.Readback) -> None:
        waits[0] += not self.ready()
        resolve(self)

    readback.Readback.resolve = counted_resolve  # type: ignore[method-assign]
    readback.IMMEDIATE = mode == "immediate"
    kernel_state = dict(digest_kernel._state)
    if mode == "torch-ops":  # the earlier digests: torch ops, a dozen kernels per chunk
        digest_kernel._state.update(kernel=None, checked=True)
    session = None if mode == "plain" else producers.instrument(run_id=f"sync-{mode}", trace_dir=trace_root / mode, quiet=True)
    try:
        if session is not None:
            session.__enter__()
        model, optimizer = build(args.width, args.layers)
        train(model, optimizer, x, y, args.warmup)
        torch.cuda.synchronize()
        waits[0] = 0
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            start = time.perf_counter()
            host = train(model, optimizer, x, y, args.steps)
            torch.cuda.set_sync_debug_mode(0)
            torch.cuda.synchronize()
            wall = time.perf_counter() - start
        step_waits = waits[0]
    finally:
        torch.cuda.set_sync_debug_mode(0)
        if session is not None:
            session.__exit__(None, None, None)
        readback.Readback.resolve = resolve  # type: ignore[method-assign]
        readback.IMMEDIATE = False
        digest_kernel._state.update(kernel_state)
    syncs = [w for w in caught if "called a synchronizing" in str(w.message)]
    where = Counter(f"{Path(w.filename).name}:{w.lineno}" for w in syncs).most_common(3)
    row: dict[str, object] = {
        "mode": mode, "syncs": len(syncs) / args.steps, "waits": step_waits / args.steps,
        "host_ms": statistics.median(host) * 1e3, "wall_ms": wall / args.steps * 1e3, "where": where,
    }
    if session is not None:
        row["check"] = check(trace_root / mode, model)
    return row


def check(trace_dir: Path, model: nn.Module) -> str:
    """Traced values are complete and equal an immediate read of the final parameters."""
    (batches,) = read_trace_dir(trace_dir).values()
    states = [e for b in batches for e in b["events"] if e["kind"] == "state"]
    missing = sum(1 for e in states if "data_digest" in e["attrs"] and e["attrs"]["data_norm"] is None)
    last = max(b["step"] for b in batches if any(e.get("at") == "post:torch.optim.Optimizer.step" for e in b["events"]))
    final = {e["name"]: e["attrs"] for b in batches if b["step"] == last for e in b["events"]
             if e["kind"] == "state" and e["at"] == "post:torch.optim.Optimizer.step"}
    params = dict(model.named_parameters())
    names = sorted(final)
    expected = tensor_digests([params[n].detach() for n in names])
    wrong = sum(final[n]["data_digest"] != d for n, d in zip(names, expected))
    norms_off = sum(abs(final[n]["data_norm"] - float(params[n].detach().norm())) > 1e-3 * (1 + final[n]["data_norm"])
                    for n in names)
    seqs = [b["seq"] for b in batches]
    return (f"{len(states)} states, {missing} without values, {wrong}/{len(names)} final digests differ, "
            f"{norms_off} norms off, seq in order: {seqs == list(range(len(seqs)))}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=512)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("host_sync_gpu: needs a CUDA device (torch.cuda.is_available() is False); nothing measured",
              file=sys.stderr)
        return 2
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.steps} measured steps")
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(mode, args, Path(tmp)) for mode in ("plain", "deferred", "torch-ops", "immediate")]
    print(f"{'mode':<10} {'syncs/step':>10} {'event waits/step':>16} {'host ms/step (median)':>22} {'wall ms/step':>12}")
    for row in rows:
        print(f"{row['mode']:<10} {row['syncs']:>10.2f} {row['waits']:>16.2f} {row['host_ms']:>22.3f} {row['wall_ms']:>12.3f}")
    for row in rows:
        if row["where"]:
            print(f"{row['mode']}: syncs from {row['where']}")
        if "check" in row:
            print(f"{row['mode']} check: {row['check']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
