"""The end-of-run summary of `trainwatch collect`: what each process captured.

Each instrumented process writes a small JSON report when it exits normally.  A
process that was killed leaves none, so trace files without a report are read back
(complete frames only) to still say how far they got.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from invariants.codec import TRACE_SUFFIX, FrameScan, TraceCorruption, decode_batch, iter_frames
from invariants.events import SchemaError

from .sampling import sampling_note


@dataclass
class ProcessReport:
    rank: int
    world: int
    pid: int | None
    steps: int
    events: int
    batches: int
    dropped_batches: int = 0
    dropped_events: int = 0
    trace_file: str | None = None
    note: str = ""


@dataclass
class RunReport:
    run: str
    processes: list[ProcessReport] = field(default_factory=list)
    kafka_errors: list[str] = field(default_factory=list)
    workers: int = 0  # DataLoader worker processes that reported their seeds

    @property
    def total_dropped_batches(self) -> int:
        return sum(p.dropped_batches for p in self.processes)


def read_trace_summary(path: Path) -> ProcessReport:
    """Count what a trace file holds; a torn tail is reported, not fatal."""
    scan = FrameScan()
    rank = world = 0
    pid = None
    steps = events = batches = 0
    note = ""
    try:
        with open(path, "rb") as stream:
            for payload in iter_frames(stream, scan):
                batch = decode_batch(payload)
                rank, world, pid = batch["rank"], batch["world"], batch.get("pid", pid)
                batches += 1
                events += len(batch["events"])
                steps += sum(
                    1 for e in batch["events"] if e.get("kind") == "step" and e.get("phase") == "end" and not e.get("final")
                )
    except (OSError, TraceCorruption, SchemaError) as exc:
        note = f"unreadable: {exc}"
    if scan.truncated_at is not None:
        note = f"torn tail at byte {scan.truncated_at}"
    return ProcessReport(rank, max(world, 1), pid, steps, events, batches, trace_file=str(path), note=note)


def collect_report(run: str, stats_dir: Path, trace_dir: Path | None) -> RunReport:
    report = RunReport(run)
    reported_files: set[str] = set()
    for stats_file in sorted(stats_dir.glob("*.json")):
        try:
            data: dict[str, Any] = json.loads(stats_file.read_text())
        except (OSError, ValueError):
            continue
        sinks = data.get("sinks") or {}
        lossy = sinks.get("kafka") or sinks.get("file") or {}
        process = ProcessReport(
            rank=int(data.get("rank", 0)),
            world=int(data.get("world", 1)),
            pid=data.get("pid"),
            steps=int(data.get("steps", 0)),
            events=int(data.get("events", 0)),
            batches=int(data.get("batches", 0)),
            dropped_batches=int(lossy.get("dropped_batches", 0)),
            dropped_events=int(lossy.get("dropped_events", 0)),
            trace_file=data.get("trace_file"),
            note="; ".join(n for n in (data.get("trace_error"), _errors(data), sampling_note(data.get("sampling")))
                           if n),
        )
        if data.get("role") == "worker":
            report.workers += 1
            if data.get("trace_file"):
                reported_files.add(str(Path(data["trace_file"]).resolve()))
            continue
        if data.get("kafka_error") and lossy.get("dropped_batches"):
            report.kafka_errors.append(str(data["kafka_error"]))
        if process.trace_file:
            reported_files.add(str(Path(process.trace_file).resolve()))
        report.processes.append(process)
    if trace_dir is not None and trace_dir.is_dir():
        for path in sorted(trace_dir.glob(f"*{TRACE_SUFFIX}")):
            if str(path.resolve()) not in reported_files:
                process = read_trace_summary(path)
                process.note = "; ".join(n for n in ("no exit report (killed?)", process.note) if n)
                report.processes.append(process)
    report.processes.sort(key=lambda p: (p.rank, p.pid or 0))
    return report


def _errors(data: dict[str, Any]) -> str:
    count = int(data.get("internal_errors") or 0)
    left_out = int(data.get("left_out_calls") or 0)
    notes = [f"{count} internal errors" if count else "",
             f"{left_out} calls of a trainer pass without backward not recorded" if left_out else ""]
    return "; ".join(note for note in notes if note)


def format_report(report: RunReport, returncode: int, trace_dir: Path | None, bootstrap: str | None, topic: str) -> str:
    lines = [f"trainwatch collect: run {report.run}: command exited with code {returncode}"]
    if not report.processes:
        lines.append("  no training process was observed (no optimizer step or recorded call)")
    else:
        lines.append(f"  {'rank':>4}  {'pid':>7}  {'steps':>5}  {'events':>7}  {'batches':>7}  {'dropped':>7}  trace / notes")
        for p in report.processes:
            where = Path(p.trace_file).name if p.trace_file else "-"
            note = f"  ({p.note})" if p.note else ""
            lines.append(
                f"  {p.rank:>4}  {p.pid or '-':>7}  {p.steps:>5}  {p.events:>7}  {p.batches:>7}  "
                f"{p.dropped_batches:>7}  {where}{note}"
            )
    if report.workers:
        lines.append(f"  DataLoader workers: {report.workers} reported their seeds")
    if trace_dir is not None:
        lines.append(f"  traces: {trace_dir}")
    if bootstrap:
        dropped = report.total_dropped_batches
        status = f"{dropped} batches dropped" if dropped else "no batches dropped"
        lines.append(f"  kafka: {bootstrap} topic {topic}: {status}")
        for error in sorted(set(report.kafka_errors))[:1]:
            lines.append(f"  kafka last error: {error}")
    return "\n".join(lines)


def read_trace_batches(path: Path) -> list[dict[str, Any]]:
    """Every complete batch of one trace file, decoded and validated, in file order."""
    with open(path, "rb") as stream:
        return [decode_batch(payload) for payload in iter_frames(stream)]


def read_trace_dir(directory: Path) -> dict[str, list[dict[str, Any]]]:
    """``file name -> batches`` for every trace file in a directory."""
    return {path.name: read_trace_batches(path) for path in sorted(Path(directory).glob(f"*{TRACE_SUFFIX}"))}
