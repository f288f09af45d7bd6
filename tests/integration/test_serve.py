"""`trainwatch serve` refuses bad settings and unreachable or mismatched brokers clearly."""

from __future__ import annotations

import subprocess
import sys
import time

from stream_checkers.embedded_broker import free_port


def _serve(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainwatch.cli", "serve", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_bad_settings_exit_2_with_one_line(clean_env, tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    cases = [
        ([], "no bootstrap server given"),
        (["--bootstrap", "nohostport"], "is not HOST:PORT"),
        (["--bootstrap", "127.0.0.1:9", "--partitions", "0"], "--partitions must be at least 1"),
        (["--bootstrap", "127.0.0.1:9", "-i", str(broken)], "not valid JSON"),
    ]
    for args, message in cases:
        result = _serve(args, clean_env)
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_bad_environment_value_is_a_usage_error_of_serve_only(clean_env):
    env = dict(clean_env, TRAINWATCH_PARTITIONS="many")
    result = _serve(["--bootstrap", "127.0.0.1:9"], env)
    assert result.returncode == 2 and "invalid int value: 'many'" in result.stderr
    other = subprocess.run([sys.executable, "-m", "trainwatch.cli", "check", "--help"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert other.returncode == 0


def test_security_settings_come_from_the_environment(clean_env):
    env = dict(clean_env, TRAINWATCH_BOOTSTRAP="127.0.0.1:9", TRAINWATCH_KAFKA_SECURITY_PROTOCOL="SASL_SSL")
    result = _serve([], env)
    assert result.returncode == 2 and "needs a SASL username and password" in result.stderr


def test_unreachable_broker_is_reported_not_waited_on_forever(clean_env):
    started = time.monotonic()
    result = _serve(["--bootstrap", f"127.0.0.1:{free_port()}", "--connect-timeout", "3"], clean_env)
    assert result.returncode == 2
    assert "Kafka at 127.0.0.1:" in result.stderr
    assert time.monotonic() - started < 30


def test_events_topic_with_another_partition_count_is_refused(kafka_broker, clean_env):
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
    admin.create_topics([NewTopic("trainwatch.events", 2, 1)])
    admin.close()
    env = dict(clean_env, TRAINWATCH_PARTITIONS="4")  # flags and environment agree on names
    result = _serve(["--bootstrap", kafka_broker.bootstrap, "--metrics-port", "0"], env)
    assert result.returncode == 2
    assert "has 2 partitions but the checker runs with --partitions 4" in result.stderr
