"""Read a TRACE_DIR of ``*.twtrace`` files into batches, in step order across files.

One file per process; each file is already in step order, so a k-way merge on the
step number hands the engine every rank's step *k* before anyone's step *k+1* and
windows close as soon as they can: memory stays bounded by a few open windows, not by
the trace size.  The merge reads every file in turn, but at most `MAX_OPEN_FILES` are
open at once (a large job's directory holds more files than a process may open): a
file closed to make room is reopened at the position it was read up to.

Damage is reported precisely: a last frame cut short (a killed writer) is recorded in
`TraceReadReport.truncated` and skipped; anything else raises `TraceDirError` naming
the file and byte offset.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator

from invariants.codec import (
    TRACE_MAGIC,
    TRACE_SUFFIX,
    FRAME_HEADER,
    FrameScan,
    TraceCorruption,
    decode_batch,
    encode_batch,
    encode_frame,
    iter_frames,
)
from invariants.events import Batch, SchemaError


#: Trace files held open at once while merging; the rest are reopened when next read.
MAX_OPEN_FILES = 64


class TraceDirError(ValueError):
    """Unreadable input: the message names the path and, for corruption, the byte offset."""


@dataclass
class TraceReadReport:
    files: list[str] = field(default_factory=list)
    batches: int = 0
    events: int = 0
    truncated: list[tuple[str, int]] = field(default_factory=list)


def trace_files(trace_dir: str | Path) -> list[Path]:
    root = Path(trace_dir)
    if not root.exists():
        raise TraceDirError(f"{root}: no such trace directory")
    if root.is_file():
        return [root]
    files = sorted(p for p in root.rglob(f"*{TRACE_SUFFIX}") if p.is_file())
    if not files:
        raise TraceDirError(f"{root}: no {TRACE_SUFFIX} files found")
    return files


def _header(batch: Any) -> tuple[int, int]:
    """(step, number of events) of a dict or typed batch."""
    if isinstance(batch, dict):
        return batch["step"], len(batch["events"])
    return batch.step, len(batch.events)


class _OpenFiles:
    """The descriptors of a merge: at most ``limit`` open, least recently read closed first."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open: OrderedDict[_ResumableFile, None] = OrderedDict()

    def touch(self, file: "_ResumableFile") -> None:
        self.open.move_to_end(file)

    def admit(self, file: "_ResumableFile") -> None:
        while len(self.open) >= self.limit:
            oldest, _ = self.open.popitem(last=False)
            oldest.release()
        self.open[file] = None

    def forget(self, file: "_ResumableFile") -> None:
        self.open.pop(file, None)


class _ResumableFile:
    """A binary stream over one trace file that may be closed between reads and
    reopens where it left off: `iter_frames` reads it as if it stayed open."""

    def __init__(self, path: Path, files: _OpenFiles) -> None:
        self.path = path
        self.files = files
        self.position = 0
        self.handle: BinaryIO | None = None

    def read(self, size: int) -> bytes:
        if self.handle is None:
            self.files.admit(self)
            self.handle = self.path.open("rb")
            self.handle.seek(self.position)
        else:
            self.files.touch(self)
        data = self.handle.read(size)
        self.position += len(data)
        return data

    def release(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None

    def close(self) -> None:
        self.release()
        self.files.forget(self)


def _file_batches(path: Path, report: TraceReadReport, decode: Callable[[bytes], Any],
                  files: _OpenFiles) -> Iterator[Any]:
    scan = FrameScan()
    offset = len(TRACE_MAGIC)
    stream = _ResumableFile(path, files)
    try:
        for payload in iter_frames(stream, scan):  # type: ignore[arg-type]
            try:
                batch = decode(payload)
            except SchemaError as exc:
                raise TraceDirError(f"{path}: corrupt batch at byte offset {offset}: {exc}") from None
            offset += FRAME_HEADER.size + len(payload)
            report.batches += 1
            report.events += _header(batch)[1]
            yield batch
    except TraceCorruption as exc:
        raise TraceDirError(f"{path}: corrupt at byte offset {exc.offset}: {exc}") from None
    except OSError as exc:
        raise TraceDirError(f"{path}: cannot read: {exc.strerror or exc}") from None
    finally:
        stream.close()
    if scan.truncated_at is not None:
        report.truncated.append((str(path), scan.truncated_at))


def read_trace_dir(trace_dir: str | Path, report: TraceReadReport | None = None, *,
                   decode: Callable[[bytes], Any] = decode_batch,
                   max_open_files: int = MAX_OPEN_FILES) -> Iterator[Any]:
    """All batches of a trace directory, merged by step (ties: file order, then file position).

    ``decode`` turns a frame into a batch: dicts by default; ``check`` and ``infer`` pass
    a typed decoder (`invariants.wire`), which is what their engine folds fastest.
    """
    report = report if report is not None else TraceReadReport()
    files = trace_files(trace_dir)
    report.files.extend(str(f) for f in files)
    open_files = _OpenFiles(max_open_files)
    streams = [
        ((_header(batch)[0], index, position, batch)
         for position, batch in enumerate(_file_batches(path, report, decode, open_files)))
        for index, path in enumerate(files)
    ]
    for _, _, _, batch in heapq.merge(*streams, key=lambda item: item[:3]):
        yield batch


def write_trace_dir(directory: str | Path, batches: Iterable[Batch], *, prefix: str = "") -> dict[int, Path]:
    """Write batches as one trace file per rank, the layout `trainwatch collect` produces.

    For synthetic runs (tests, benchmarks, the default-set curation's healthy
    validation runs): they must be read back through exactly the path real traces take.
    Returns the file of each rank.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    streams: dict[int, BinaryIO] = {}
    paths: dict[int, Path] = {}
    try:
        for batch in batches:
            rank = batch["rank"]
            stream = streams.get(rank)
            if stream is None:
                paths[rank] = directory / f"{prefix}rank{rank}{TRACE_SUFFIX}"
                stream = streams[rank] = paths[rank].open("wb")
                stream.write(TRACE_MAGIC)
            stream.write(encode_frame(encode_batch(batch)))
    finally:
        for stream in streams.values():
            stream.close()
    return paths
