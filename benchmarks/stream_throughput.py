"""Streaming checker throughput and detection latency, measured on real processes.

* **Throughput**: a healthy run of synthetic 2-rank data-parallel steps
  (`invariants.synthetic.SyntheticRun`: zero_grad, a forward with module and functional
  children, backward with all-reduces, optimizer step with parameter snapshots before
  and after, step-end snapshots, periodic eval passes and DataLoader worker starts; one
  batch per rank and step, as the producer ships them) is produced to a fresh embedded
  broker *before* the checker starts, then one worker — and in a second round two
  workers of one consumer group — check it with the shipped default invariant set.
  ``--layers`` adds linear layers, to size the steps like a bigger model's.  The rate is read from the workers' own
  ``trainwatch_events_consumed_total`` between 10 % and 90 % of the run, so start-up
  and group join are excluded.
* **Latency**: with a worker caught up, a step whose replicas diverge is produced and
  ``/metrics`` is polled every 5 ms until ``trainwatch_violations_total`` for that run
  moves; the latency runs from the moment the last rank's batch was sent (the step's
  end at the producer).

Usage::

    python benchmarks/stream_throughput.py [--events 600000] [--layers 0 40] [--rounds 3]
                                           [--latency-samples 10] [--multi-record-batches] [--json FILE]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from invariants.codec import encode_batch  # noqa: E402
from invariants.events import batch_key  # noqa: E402
from invariants.synthetic import SyntheticRun  # noqa: E402
from stream_checkers.embedded_broker import EmbeddedBroker  # noqa: E402
from tests.support.kafka import CheckerProcess, metric, synthetic_step_batch  # noqa: E402

TOPIC = "trainwatch.events"


def make_run(run: str, steps: int, layers: int) -> tuple[list[tuple[bytes, bytes]], int]:
    """A healthy run (zero violations with the shipped set), one batch per rank and step.

    That is what the producer ships: a step's events go out together when the step
    ends.  ``layers`` extra linear layers make the steps as large as a bigger model's
    (each adds a module forward and five parameter snapshots per step).
    """
    records, events = [], 0
    for batch in SyntheticRun(run=run, steps=steps, extra_layers=layers, split_steps=False).batches():
        events += len(batch["events"])
        records.append((batch_key(run, batch["step"]), encode_batch(batch)))
    return records, events


def _cpu_seconds(proc: CheckerProcess) -> float:
    """User + system CPU seconds of a worker process so far (Linux /proc).

    On a shared machine a worker gets only part of a core; events per CPU-second is
    what one dedicated core would sustain, the wall rate is what this machine gave.
    """
    try:
        fields = Path(f"/proc/{proc.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, AttributeError):
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def produce(bootstrap: str, records: list[tuple[bytes, bytes]]) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=256 * 1024,
                             max_request_size=8 * 1024 * 1024)
    for key, value in records:
        producer.send(TOPIC, key=key, value=value)
    producer.flush(timeout=120)
    producer.close()


def throughput(workers: int, steps: int, layers: int, workdir: Path, extra: list[str]) -> dict:
    run = f"bench-{workers}w-{layers}"
    records, total_events = make_run(run, steps, layers)
    with EmbeddedBroker(log_path=workdir / f"broker-{workers}.log") as broker:
        # the first worker creates the topics with the checker's partition count
        procs = [CheckerProcess(broker.bootstrap, workdir / f"w{workers}-{i}.log",
                                ["--partitions", "4", "--data-dir", str(workdir / f"w{workers}-{i}"), *extra])
                 for i in range(workers)]
        from stream_checkers.config import CheckerConfig
        from stream_checkers.topics import ensure_topics

        ensure_topics(CheckerConfig(bootstrap=broker.bootstrap, partitions=4))
        produce(broker.bootstrap, records)
        for proc in procs:  # launched together, so they join the group in one generation
            proc.launch()
        for proc in procs:
            proc.wait_ready()
        try:
            samples: list[tuple[float, float]] = []
            settled_at: float | None = None
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                pages = [p.metrics() for p in procs]
                consumed = sum(metric(m, "trainwatch_events_consumed_total", run=run) for m in pages)
                owned = [metric(m, "trainwatch_assigned_partitions") for m in pages]
                now = time.monotonic()
                if settled_at is None and (workers == 1 or (sum(owned) == 4 and all(owned))):
                    settled_at = now  # every worker owns partitions: the group has settled
                if settled_at is not None:
                    samples.append((now, consumed, sum(_cpu_seconds(p) for p in procs)))
                if consumed >= total_events:
                    break
                time.sleep(0.05)
            if len(samples) < 3 or samples[0][1] > 0.5 * total_events:
                raise RuntimeError("the group settled too late to measure; use more --steps")
            start = max(0.1 * total_events, samples[0][1])
            if start >= 0.9 * total_events:
                raise RuntimeError("nothing left to measure after the group settled; use more --steps")
            lo = next(s for s in samples if s[1] >= start)
            hi = next(s for s in samples if s[1] >= 0.9 * total_events)
            rate = (hi[1] - lo[1]) / max(hi[0] - lo[0], 1e-9)
            cpu = hi[2] - lo[2]
            cpu_share = cpu / max(hi[0] - lo[0], 1e-9) / workers
            checked = sum(metric(p.metrics(), "trainwatch_steps_checked_total", run=run) for p in procs)
            violations = sum(metric(p.metrics(), "trainwatch_violations_total", run=run) for p in procs)
            split = [metric(p.metrics(), "trainwatch_events_consumed_total", run=run) for p in procs]
        finally:
            for proc in procs:
                proc.stop()
    return {"workers": workers, "events": total_events, "batches": len(records),
            "events_per_batch": round(total_events / len(records), 1), "events_per_s": round(rate),
            "events_per_worker_cpu_s": round((hi[1] - lo[1]) / max(cpu, 1e-9)),
            # one batch per rank and step, two ranks
            "steps_per_worker_cpu_s": round((hi[1] - lo[1]) / max(cpu, 1e-9) / (2 * total_events / len(records))),
            "worker_cpu_share": round(cpu_share, 2),
            "steps_checked_at_end": checked, "violations": violations, "events_per_worker": split}


def cpu_ceiling(steps: int, layers: int) -> dict:
    """The agent's per-batch work without Kafka or Faust, split by stage (one process,
    CPU time of this thread, so other jobs on the machine do not count).  Windows that
    close within a moment are never written to the table (`pending_windows`), so no
    window record is serialised here."""
    from invariants.step_summary import StepSummaryBuilder
    from stream_checkers.engine_port import EnginePort
    from stream_checkers.worker import tune_gc_for_streaming

    tune_gc_for_streaming()  # as a worker does
    records, total_events = make_run("cpu", steps, layers)
    engine = EnginePort.load(None)
    run_state = engine.new_run_state("cpu")
    timings = dict.fromkeys(("decode", "engine_add", "summary", "evaluate"), 0.0)
    windows: dict[int, tuple] = {}
    clock = time.thread_time
    violations = 0
    for _, value in records:
        t0 = clock()
        batch = engine.decode(value, len(value))
        t1 = clock()
        step = batch.step
        if step not in windows:
            windows[step] = (engine.open("cpu", step), StepSummaryBuilder("cpu", step))
        window, summary = windows[step]
        engine.add(window, batch)
        t2 = clock()
        summary.add_batch(batch)
        t3 = clock()
        timings["decode"] += t1 - t0
        timings["engine_add"] += t2 - t1
        timings["summary"] += t3 - t2
        if engine.complete(window):
            t4 = clock()
            violations += len(engine.evaluate(window, run_state))
            summary.summary()
            timings["evaluate"] += clock() - t4
            del windows[step]
    total = sum(timings.values())
    return {"events_per_batch": round(total_events / len(records), 1), "events_per_s": round(total_events / total),
            "violations": violations,
            "us_per_event": {k: round(v / total_events * 1e6, 2) for k, v in timings.items()}}


def latency(samples: int, workdir: Path, extra: list[str]) -> dict:
    from kafka import KafkaProducer

    with EmbeddedBroker(log_path=workdir / "broker-latency.log") as broker:
        proc = CheckerProcess(broker.bootstrap, workdir / "latency.log",
                              ["--partitions", "4", "--data-dir", str(workdir / "latency"), *extra]).start()
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
        try:
            # warm-up: one healthy step, so the group has joined and partitions are assigned
            for rank in (0, 1):
                batch = synthetic_step_batch("warm", rank, 2, 0)
                producer.send(TOPIC, key=batch_key("warm", 0), value=encode_batch(batch))
            producer.flush()
            deadline = time.monotonic() + 120
            while metric(proc.metrics(), "trainwatch_steps_checked_total", run="warm") < 1:
                if time.monotonic() > deadline:
                    raise TimeoutError("checker never checked the warm-up step")
                time.sleep(0.05)
            results = []
            for i in range(samples):
                run = f"lat-{i}"
                for rank in (0, 1):
                    batch = synthetic_step_batch(run, rank, 2, 5, digest="x3:bad" if rank else None)
                    producer.send(TOPIC, key=batch_key(run, 5), value=encode_batch(batch))
                producer.flush()
                sent = time.monotonic()
                while metric(proc.metrics(), "trainwatch_violations_total", run=run) < 1:
                    if time.monotonic() - sent > 30:
                        raise TimeoutError(f"no violation for {run} in /metrics")
                    time.sleep(0.005)
                results.append(time.monotonic() - sent)
        finally:
            producer.close()
            proc.stop()
    return {"samples": samples, "median_s": round(statistics.median(results), 4),
            "max_s": round(max(results), 4), "min_s": round(min(results), 4)}


def _medians(rounds: list[dict]) -> dict:
    """Median and range over rounds of the figures the results table quotes (on a shared
    VM one round can be off by a third)."""
    def spread(values: list[float]) -> dict:
        return {"median": round(statistics.median(values)), "min": round(min(values)), "max": round(max(values))}

    return {
        "events_per_batch": rounds[0]["one_worker"]["events_per_batch"],
        "ceiling_events_per_cpu_s": spread([r["cpu_ceiling_one_core"]["events_per_s"] for r in rounds]),
        **{f"{who}_{figure}": spread([r[who][figure] for r in rounds])
           for who in ("one_worker", "two_workers")
           for figure in ("events_per_s", "events_per_worker_cpu_s", "steps_per_worker_cpu_s")},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=600_000,
                        help="events per throughput round (the step count follows from the step size)")
    parser.add_argument("--layers", type=int, nargs="+", default=[0, 40],
                        help="extra linear layers of the synthetic model, one round per value")
    parser.add_argument("--latency-samples", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3,
                        help="measurements per step size; the report gives each round and their medians")
    parser.add_argument("--multi-record-batches", action="store_true",
                        help="run the workers with --multi-record-batches (not recovery-safe on tansu)")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    extra = ["--multi-record-batches"] if args.multi_record_batches else []
    report: dict = {"workloads": []}
    with tempfile.TemporaryDirectory(prefix="tw-stream-bench-") as tmp:
        workdir = Path(tmp)
        sizes = {}
        for layers in args.layers:
            per_step = make_run("probe", 4, layers)[1] / 4  # events per step, both ranks
            sizes[layers] = max(200, int(args.events / per_step))
        rounds: dict[int, list[dict]] = {layers: [] for layers in args.layers}
        for round_index in range(args.rounds):  # rounds outermost: slow drifts of the machine hit every size
            for layers, steps in sizes.items():
                rounds[layers].append({
                    "cpu_ceiling_one_core": cpu_ceiling(min(steps, 400), layers),
                    "one_worker": throughput(1, steps, layers, workdir, extra),
                    "two_workers": throughput(2, steps, layers, workdir, extra),
                })
                print(json.dumps({"round": round_index, "layers": layers, **rounds[layers][-1]}), flush=True)
        for layers, measured in rounds.items():
            report["workloads"].append({"layers": layers, "median": _medians(measured), "rounds": measured})
        if args.latency_samples:
            report["latency"] = latency(args.latency_samples, workdir, extra)
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
