"""Shared fixtures: real brokers on free loopback ports, started and stopped by the tests."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# CI machines have 2 shared cores: generation speed and per-example time say nothing
# about correctness there, so property tests neither time out nor fail a health check
# for being slow.
settings.register_profile(
    "trainwatch", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.load_profile("trainwatch")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
if str(ROOT) not in sys.path:  # test-only helpers are imported as `tests.support`
    sys.path.insert(0, str(ROOT))


@pytest.fixture
def kafka_broker(tmp_path):
    """A fresh tansu broker per test: memory storage, so no state leaks between tests."""
    from stream_checkers.embedded_broker import EmbeddedBroker

    broker = EmbeddedBroker(log_path=tmp_path / "broker.log")
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def python_exe() -> str:
    return sys.executable


@pytest.fixture
def clean_env() -> dict[str, str]:
    """The environment a child training process should see: no leaked trainwatch settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINWATCH_")}
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


@pytest.fixture
def tls_kafka_broker(tmp_path):
    """A fresh tansu broker reachable only over TLS (stunnel in front, throwaway CA).

    Skips when stunnel is missing, and fails instead when TRAINWATCH_REQUIRE_SYSTEM_DEPS=1
    (CI installs it with scripts/install-system-deps.sh).
    """
    from tests.support.tls_broker import TlsKafkaBroker, find_stunnel

    if find_stunnel() is None:
        reason = "stunnel is not installed (bash scripts/install-system-deps.sh installs it)"
        if os.environ.get("TRAINWATCH_REQUIRE_SYSTEM_DEPS") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    broker = TlsKafkaBroker(tmp_path / "tls-broker")
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
