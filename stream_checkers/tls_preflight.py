"""One verified TLS handshake per bootstrap server, before the Kafka clients start.

Two failures of a TLS setup are otherwise reported badly or not at all:

* an ``SSL`` client aimed at a plaintext listener sends its ClientHello and the broker
  waits for the rest of what it reads as a huge Kafka request; kafka-python 3.0 awaits
  that handshake without a deadline, so ``serve`` would hang forever;
* a certificate signed by another CA, or issued for another host, ends after the
  whole connect timeout as a generic "unable to bootstrap", which names neither the
  certificate nor the variable to fix.

A direct handshake with the very ``SSLContext`` the checker uses, under a deadline,
answers both in milliseconds with one sentence.  The reverse mistake (a plaintext
client at a TLS port) makes the clients fail on their own, within the connect
timeout; `tls_listener_hint` then says why.
"""

from __future__ import annotations

import socket
import ssl
from typing import Iterable

from .config import KafkaSecurity

_USE_TLS = "set TRAINWATCH_KAFKA_SECURITY_PROTOCOL=SSL (or SASL_SSL) and TRAINWATCH_KAFKA_SSL_CAFILE"


class KafkaTlsError(RuntimeError):
    """The bootstrap servers reject this client's TLS settings; the message says how."""


def _split(server: str) -> tuple[str, int]:
    host, _, port = server.rpartition(":")
    return host.strip("[]"), int(port)


#: `_handshake` outcomes other than a problem description
VERIFIED, UNREACHABLE = "verified", "unreachable"


def _handshake(server: str, context: ssl.SSLContext, timeout_s: float) -> str:
    """`VERIFIED`, `UNREACHABLE`, or a sentence saying what is wrong with ``server``.

    Unreachable servers are left to the clients, which retry for the connect timeout
    (a broker may still be starting); only a server that answers and then fails the
    handshake is a definite configuration error.
    """
    host, port = _split(server)
    try:
        raw = socket.create_connection((host, port), timeout=timeout_s)
    except OSError:
        return UNREACHABLE
    try:
        with context.wrap_socket(raw, server_hostname=host):
            return VERIFIED
    except ssl.SSLCertVerificationError as exc:
        return (f"{server} presents a certificate this client does not trust ({exc.verify_message.rstrip('.')}); "
                "check TRAINWATCH_KAFKA_SSL_CAFILE and that the certificate names this host")
    except TimeoutError:
        return (f"{server} did not answer the TLS handshake within {timeout_s:g}s; "
                "is it a plaintext listener? (then use PLAINTEXT or SASL_PLAINTEXT)")
    except (ssl.SSLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc.strerror or type(exc).__name__
        return f"{server} broke off the TLS handshake ({reason}); is it a TLS listener?"
    finally:
        raw.close()


def check_tls(servers: Iterable[str], security: KafkaSecurity, timeout_s: float = 10.0) -> None:
    """Raise `KafkaTlsError` when no server verifies and some server fails the handshake.

    One verified server is enough: the clients learn the others from its metadata and
    report their own errors from there.  Without TLS in ``security`` this does nothing.
    """
    context = security.ssl_context()
    if context is None:
        return
    problems = []
    for server in servers:
        outcome = _handshake(server, context, timeout_s)
        if outcome == VERIFIED:
            return
        if outcome != UNREACHABLE:
            problems.append(outcome)
    if problems:
        raise KafkaTlsError("; ".join(problems))


def tls_listener_hint(servers: Iterable[str], security: KafkaSecurity, timeout_s: float = 2.0) -> str | None:
    """For a plaintext client that failed: which server speaks TLS, and what to set.

    Only called after the clients gave up, so probing costs a healthy start nothing.
    The handshake is not verified: the question is only whether TLS answers at all.
    """
    if security.ssl_context() is not None:
        return None
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    for server in servers:
        host, port = _split(server)
        try:
            with socket.create_connection((host, port), timeout=timeout_s) as raw:
                with context.wrap_socket(raw, server_hostname=host):
                    return f"{server} is a TLS listener: {_USE_TLS}"
        except (OSError, ssl.SSLError):
            continue
    return None
