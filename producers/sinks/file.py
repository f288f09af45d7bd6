"""Append-only, crash-safe trace files: one per process.

Each batch becomes one frame (length, crc32, payload) written with a single
``os.write`` on an ``O_APPEND`` descriptor, so a process killed at any instant leaves
a file whose complete frames are all readable and whose torn tail, if any, is
recognised as truncation by `invariants.codec.iter_frames`.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from invariants.codec import TRACE_MAGIC, TRACE_SUFFIX, encode_frame
from invariants.events import Batch

from . import SinkStats


def trace_file_name(run: str, rank: int, pid: int) -> str:
    safe_run = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in run)
    return f"{safe_run}-rank{rank}-pid{pid}{TRACE_SUFFIX}"


class FileSink:
    """Writes frames to ``<dir>/<run>-rank<r>-pid<pid>.twtrace``, opened on first batch.

    Opening lazily means processes that never train (launchers, helpers) leave no
    file, and the rank in the name is the one known when training actually started.
    """

    name = "file"

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.path: Path | None = None
        self._fd: int | None = None
        self._stats = SinkStats()
        self._lock = threading.Lock()
        self.error: str | None = None

    def _open(self, batch: Batch) -> int:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / trace_file_name(batch["run"], batch["rank"], os.getpid())
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        if os.fstat(fd).st_size == 0:
            os.write(fd, TRACE_MAGIC)
        self.path = path
        return fd

    def write(self, batch: Batch, payload: bytes) -> None:
        events = len(batch["events"])
        with self._lock:
            if self.error is not None:
                self._stats.dropped_batches += 1
                self._stats.dropped_events += events
                return
            try:
                if self._fd is None:
                    self._fd = self._open(batch)
                frame = encode_frame(payload)
                written = os.write(self._fd, frame)
                if written != len(frame):  # a short write is a full disk; the tail is torn
                    raise OSError(f"short write ({written} of {len(frame)} bytes)")
            except OSError as exc:
                self.error = f"trace file {self.path or self.directory}: {exc}"
                self._stats.dropped_batches += 1
                self._stats.dropped_events += events
                return
            self._stats.sent_batches += 1
            self._stats.sent_events += events

    def stats(self) -> SinkStats:
        return self._stats

    def wait_delivered(self, timeout_s: float = 0.0) -> bool:
        return True  # every write reached the file before `write` returned

    def close(self, timeout_s: float = 0.0) -> None:
        with self._lock:
            if self._fd is not None:
                try:
                    os.close(self._fd)
                finally:
                    self._fd = None

    def forget_after_fork(self) -> None:
        """In a forked child: drop the parent's descriptor without closing its file."""
        self._fd = None
        self.path = None
        self._stats = SinkStats()
        self._lock = threading.Lock()
