"""A TLS-only Kafka endpoint on loopback: the embedded broker behind stunnel.

The bundled tansu broker speaks plaintext only, yet deployments run the checkers and
producers with ``SSL``/``SASL_SSL``, and those settings must be exercised against a
real TLS listener, certificate verification included.  So this module puts stunnel
(a TLS terminator) in front of tansu: tansu listens on a private port and advertises
stunnel's port in its metadata, because Kafka clients reconnect to the *advertised*
address; every client connection therefore stays on TLS.  The certificates are a
throwaway CA and a server certificate for ``IP:127.0.0.1`` made with the ``openssl``
command, so clients verify the chain and the host name exactly as they would in
production.  Used by tests; nothing here is needed to run trainwatch.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from stream_checkers.embedded_broker import EmbeddedBroker, end_process, free_port

LOOPBACK = "127.0.0.1"


class TlsUnavailable(RuntimeError):
    """A TLS endpoint cannot be set up here (a tool is missing or failed); says why."""


def find_stunnel() -> str | None:
    """The stunnel binary: $TRAINWATCH_STUNNEL, else ``stunnel4`` (Debian) or ``stunnel``."""
    override = os.environ.get("TRAINWATCH_STUNNEL")
    if override:
        return override if os.access(override, os.X_OK) else None
    return shutil.which("stunnel4") or shutil.which("stunnel")


@dataclass(frozen=True)
class Certificates:
    """Files of one throwaway CA and the server certificate it signed."""

    ca_file: Path
    cert_file: Path
    key_file: Path


def _openssl(*argv: str, cwd: Path) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        raise TlsUnavailable("the openssl command is not installed")
    result = subprocess.run([binary, *argv], cwd=cwd, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise TlsUnavailable(f"openssl {argv[0]} failed: {result.stderr.strip()[-500:]}")


def make_certificates(directory: Path, ip: str = LOOPBACK, name: str = "trainwatch test") -> Certificates:
    """Create a CA and a server certificate for ``ip`` (SAN ``IP:<ip>``) in ``directory``.

    Elliptic-curve keys are generated in milliseconds, where RSA keys would cost a
    noticeable share of a test.  The extensions (key usage, key identifiers) are the
    ones strict verifiers require of a chain, so that a rejection in a test can only
    mean a wrong CA or host, never a sloppy certificate.
    """
    directory.mkdir(parents=True, exist_ok=True)
    key_args = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *key_args, "-days", "2", "-subj", f"/CN={name} CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             "-addext", "subjectKeyIdentifier=hash",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=directory)
    _openssl("req", "-new", *key_args, "-subj", f"/CN={ip}", "-keyout", "server.key", "-out", "server.csr",
             cwd=directory)
    (directory / "server.ext").write_text(
        f"subjectAltName = IP:{ip}\n"
        "basicConstraints = critical,CA:FALSE\n"
        "keyUsage = critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage = serverAuth\n"
        "subjectKeyIdentifier = hash\n"
        "authorityKeyIdentifier = keyid,issuer\n"
    )
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "2", "-extfile", "server.ext", "-out", "server.pem", cwd=directory)
    return Certificates(directory / "ca.pem", directory / "server.pem", directory / "server.key")


def tls_handshake_succeeds(host: str, port: int, ca_file: Path, timeout_s: float = 2.0) -> bool:
    """Whether ``host:port`` completes a verified TLS handshake now (False if it refuses)."""
    context = ssl.create_default_context(cafile=str(ca_file))
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw:
            with context.wrap_socket(raw, server_hostname=host):
                return True
    except (OSError, ssl.SSLError):
        return False


@dataclass
class TlsTerminator:
    """A stunnel child: TLS on ``accept_port``, plaintext to ``connect_port``."""

    connect_port: int
    certificates: Certificates
    workdir: Path
    accept_port: int = 0
    _proc: subprocess.Popen | None = field(default=None, repr=False)
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def log_path(self) -> Path:
        return self.workdir / "stunnel.log"

    def start(self, timeout_s: float = 20.0) -> "TlsTerminator":
        binary = find_stunnel()
        if binary is None:
            raise TlsUnavailable("stunnel is not installed (bash scripts/install-system-deps.sh installs it)")
        if not self.accept_port:
            self.accept_port = free_port(LOOPBACK)
        config = self.workdir / "stunnel.conf"
        # foreground + empty pid: the process is ours to wait on and leaves no pid file;
        # logging goes to stderr, which is the log file.
        config.write_text(
            "foreground = yes\n"
            "pid =\n"
            "debug = notice\n"
            "[kafka]\n"
            f"accept = {LOOPBACK}:{self.accept_port}\n"
            f"connect = {LOOPBACK}:{self.connect_port}\n"
            f"cert = {self.certificates.cert_file}\n"
            f"key = {self.certificates.key_file}\n"
        )
        self._log = open(self.log_path, "ab")
        self._proc = subprocess.Popen([binary, str(config)], stdout=self._log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not tls_handshake_succeeds(LOOPBACK, self.accept_port, self.certificates.ca_file):
            if self._proc is not None and self._proc.poll() is not None:
                raise TlsUnavailable(f"stunnel exited with code {self._proc.returncode}: "
                                     f"{self.log_path.read_text(errors='replace').strip()[-500:]}")
            if time.monotonic() > deadline:
                raise TlsUnavailable(f"stunnel did not complete a TLS handshake on port {self.accept_port} "
                                     f"within {timeout_s:g}s (log: {self.log_path})")
            time.sleep(0.05)

    def stop(self, timeout_s: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        end_process(proc, timeout_s)
        if self._log is not None:
            self._log.close()
            self._log = None


@dataclass
class TlsKafkaBroker:
    """The embedded broker reachable only over TLS, with the CA clients must trust."""

    workdir: Path
    broker: EmbeddedBroker | None = None
    terminator: TlsTerminator | None = None
    certificates: Certificates | None = None

    @property
    def bootstrap(self) -> str:
        assert self.terminator is not None, "not started"
        return f"{LOOPBACK}:{self.terminator.accept_port}"

    @property
    def plaintext_bootstrap(self) -> str:
        """tansu's own listener, behind the terminator (clients are never told of it)."""
        assert self.broker is not None, "not started"
        return self.broker.bootstrap

    @property
    def ca_file(self) -> Path:
        assert self.certificates is not None, "not started"
        return self.certificates.ca_file

    def security_env(self) -> dict[str, str]:
        """The ``TRAINWATCH_KAFKA_*`` variables producers and checkers need for this broker."""
        return {"TRAINWATCH_KAFKA_SECURITY_PROTOCOL": "SSL", "TRAINWATCH_KAFKA_SSL_CAFILE": str(self.ca_file)}

    def kafka_python_kwargs(self) -> dict[str, Any]:
        return {"security_protocol": "SSL", "ssl_cafile": str(self.ca_file)}

    def start(self, timeout_s: float = 20.0) -> "TlsKafkaBroker":
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.certificates = make_certificates(self.workdir / "pki")
        tls_port = free_port(LOOPBACK)
        self.broker = EmbeddedBroker(log_path=self.workdir / "broker.log", advertised_port=tls_port)
        try:
            self.broker.start(timeout_s)
            self.terminator = TlsTerminator(self.broker.port, self.certificates, self.workdir,
                                            accept_port=tls_port).start(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.terminator is not None:
            self.terminator.stop()
        if self.broker is not None:
            self.broker.stop()

    def __enter__(self) -> "TlsKafkaBroker":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
