"""`trainwatch serve` with its broker killed for real (SIGKILL of the tansu child).

A checker that cannot reach Kafka must say so in ``/metrics`` (``trainwatch_broker_up``
0, no owned partitions, lag unknown rather than 0), log the clients' endless reconnect
errors as one line per interval, and stop within a bound on SIGTERM, with exit code 2
because it could not make its final offset commit.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import signal
import subprocess
import time

import pytest

from stream_checkers.app import build_faust_app
from stream_checkers.bounded_worker import EXIT_UNCLEAN_STOP, SHUTDOWN_DEADLINE_S
from stream_checkers.broker_health import BrokerHealth
from stream_checkers.client_log_limit import ClientErrorRateLimit
from stream_checkers.config import CheckerConfig, KafkaSecurity
from tests.support.kafka import CheckerProcess, metric, produce, synthetic_step_batch, wait_until

#: What docs/operations.md ("Kafka goes away under a running worker") promises for a
#: SIGTERM, whatever the broker's state.
STOP_BOUND_S = 15.0
SUMMARY = re.compile(r"broker unreachable at (\S+) for (\d+) s \((\d+) errors suppressed\)")


def _checker_with_data(broker, tmp_path, env) -> CheckerProcess:
    checker = CheckerProcess(broker.bootstrap, tmp_path / "serve.log", env=env,
                             extra_args=["--grace-seconds", "1"]).start(timeout_s=120)
    try:
        produce(broker.bootstrap, "trainwatch.events",
                [synthetic_step_batch("dead-broker", rank, 2, step) for step in range(4) for rank in range(2)])
        wait_until(lambda: metric(checker.metrics(), "trainwatch_steps_checked_total") >= 4, 90, 0.2,
                   "the checker to check the run's steps")
        samples = checker.metrics()
        assert metric(samples, "trainwatch_broker_up") == 1
        assert metric(samples, "trainwatch_assigned_partitions") == 4
    except BaseException:
        checker.kill()  # the callers' own cleanup starts only once this returns
        raise
    return checker


def _sigterm(checker: CheckerProcess) -> tuple[int, float]:
    proc = checker.proc
    assert proc is not None
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        checker.kill()
        pytest.fail("serve did not exit within 60 s of SIGTERM")
    return code, time.monotonic() - started


def _broker_up(checker: CheckerProcess, value: float) -> bool:
    return metric(checker.metrics(), "trainwatch_broker_up") == value


def test_serve_with_a_dead_broker_says_so_logs_one_line_per_interval_and_stops_in_time(
        kafka_broker, clean_env, tmp_path):
    checker = _checker_with_data(kafka_broker, tmp_path, clean_env)
    try:
        lines_before = len(checker.log_text().splitlines())
        kafka_broker.kill()
        wait_until(lambda: _broker_up(checker, 0), 30, 0.2, "trainwatch_broker_up 0")
        samples = checker.metrics()
        assert metric(samples, "trainwatch_assigned_partitions") == 0
        lags = [v for k, v in samples.items() if k.startswith("trainwatch_consumer_lag_messages{")]
        assert lags and all(math.isnan(v) for v in lags), lags  # unknown, not "caught up"

        # The clients retry the dead broker all along; the first summary line closes a
        # window of one interval (30 s) in which they were told to be quiet.
        summary = wait_until(lambda: SUMMARY.search(checker.log_text()), 90, 0.5, "the rate-limited summary line")
        assert summary.group(1) == kafka_broker.bootstrap
        assert int(summary.group(3)) > 100, summary.group(0)  # thousands before the filter
        since_kill = checker.log_text().splitlines()[lines_before:]
        errors = [line for line in since_kill if "[ERROR]" in line or "[WARNING]" in line]
        assert len(errors) <= 8, "\n".join(errors)

        code, took_s = _sigterm(checker)
    finally:
        checker.kill()
    assert took_s <= STOP_BOUND_S, f"SIGTERM to exit took {took_s:.1f} s"
    assert code == EXIT_UNCLEAN_STOP
    log = checker.log_text()
    assert "final offset commit" in log, log[-2000:]


def test_broker_up_returns_to_1_when_the_broker_is_back(kafka_broker, clean_env, tmp_path):
    checker = _checker_with_data(kafka_broker, tmp_path, clean_env)
    try:
        kafka_broker.kill()
        wait_until(lambda: _broker_up(checker, 0), 30, 0.2, "trainwatch_broker_up 0")
        kafka_broker.start()  # same port, empty storage: a broker that came back
        wait_until(lambda: _broker_up(checker, 1), 30, 0.2, "trainwatch_broker_up 1 again")
        assert "broker reachable again at " + kafka_broker.bootstrap in checker.log_text()
    finally:
        checker.kill()


def test_sigterm_with_a_live_broker_stops_cleanly_with_exit_0(kafka_broker, clean_env, tmp_path):
    checker = _checker_with_data(kafka_broker, tmp_path, clean_env)
    try:
        code, took_s = _sigterm(checker)
    finally:
        checker.kill()
    assert code == 0, checker.log_text()[-2000:]
    assert took_s <= STOP_BOUND_S and took_s < SHUTDOWN_DEADLINE_S + 1


def test_the_broker_probe_connects_with_the_workers_tls_settings(tls_kafka_broker, tmp_path):
    """A probe that ignored the worker's security settings would report a healthy TLS
    cluster as down (and page); one that connects in plaintext must fail."""
    tls = tls_kafka_broker

    def probe(security: KafkaSecurity) -> BrokerHealth:
        config = CheckerConfig(bootstrap=tls.bootstrap, security=security, data_dir=str(tmp_path / "checker"))
        health = BrokerHealth.of_app(build_faust_app(config), config.bootstrap_servers)
        asyncio.run(health.probe())
        return health

    secure = probe(KafkaSecurity.from_env(tls.security_env()))
    assert secure.up, secure.last_error
    plaintext = probe(KafkaSecurity())
    assert not plaintext.up and plaintext.last_error


# -- the rate limit on its own, with a controlled clock ----------------------------------------
class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _record(name: str, message: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, message, (), None)


def test_client_errors_pass_once_per_interval_with_the_count_of_the_rest():
    clock, up = _Clock(), [False]
    limit = ClientErrorRateLimit("kafka:9092", lambda: up[0], interval_s=30, clock=clock)
    assert limit.filter(_record("aiokafka.conn", "Unable connect to node 1"))  # the cause, as it is
    passed = []
    for _ in range(299):  # ten per second
        clock.now += 0.1
        passed += [r for r in [_record("aiokafka.client", "Unable to update metadata")] if limit.filter(r)]
    clock.now += 0.2
    summary = _record("kafka.conn", "Connect call failed")
    assert limit.filter(summary) and not passed
    assert summary.getMessage() == ("broker unreachable at kafka:9092 for 30 s (299 errors suppressed); "
                                    "latest: Connect call failed")
    # a second handler sees the verdict of the first, and does not count the record again
    assert limit.filter(summary)
    # other loggers, and client records below WARNING, are never held back
    assert limit.filter(_record("trainwatch.checker", "worker message"))
    assert limit.filter(_record("aiokafka.consumer", "debug detail", logging.INFO))
    # a quiet interval ends the burst: the next error is shown as it is again
    clock.now += 31
    up[0] = True
    fresh = _record("aiokafka.conn", "SASL authentication failed")
    assert limit.filter(fresh) and fresh.getMessage() == "SASL authentication failed"
    for _ in range(3):
        clock.now += 0.1
        assert not limit.filter(_record("aiokafka.conn", "SASL authentication failed"))
    clock.now += 29.8
    late = _record("aiokafka.conn", "SASL authentication failed")
    assert limit.filter(late)
    assert late.getMessage().startswith("Kafka client errors with the broker at kafka:9092 for 30 s "
                                        "(3 errors suppressed)")
