"""Producers and checkers over real TLS: tansu behind stunnel, a throwaway CA, host names verified.

The broker is reachable only through stunnel's TLS port (it advertises that port in
its metadata), so every client connection in these tests is encrypted and verified
against the test CA with hostname checking on.  Misconfigured clients must fail fast
with one line that names the cause, never hang.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from invariants.codec import encode_batch
from invariants.engine import Engine
from invariants.step_windows import StepWindows
from invariants.invariant_file import dumps, load_default_set, load_set
from producers.sinks import KafkaSink, kafka_settings_from_env
from tests.support.kafka import CheckerProcess, iter_violations, metric, read_topic, synthetic_step_batch, wait_until
from tests.support.tls_broker import make_certificates

ROOT = Path(__file__).resolve().parents[2]
EVENTS = "trainwatch.events"
VIOLATIONS = "trainwatch.violations"


@pytest.fixture
def tls_env(tls_kafka_broker, clean_env) -> dict[str, str]:
    return {**clean_env, **tls_kafka_broker.security_env()}


@pytest.fixture(scope="module")
def consistent_invariants(tmp_path_factory) -> str:
    """The shipped cross-rank Consistent invariants: the rules the synthetic runs exercise."""
    chosen = [inv for inv in load_default_set().invariants if inv.relation == "Consistent"]
    path = tmp_path_factory.mktemp("invariants") / "consistent.json"
    path.write_text(dumps(chosen))
    return str(path)


def _two_rank_run(run: str, steps: int, diverge_from: int) -> list[dict]:
    return [synthetic_step_batch(run, rank, 2, step, digest="x3:bad" if rank == 1 and step >= diverge_from else None)
            for step in range(steps) for rank in (0, 1)]


def _offline_violation_ids(batches: list[dict], invariants: str) -> set[str]:
    windows = StepWindows(Engine(load_set(Path(invariants).read_bytes(), invariants)))
    found = [v for batch in batches for v in windows.feed(batch)] + list(windows.finish())
    return {v.id for v in found}


def _serve(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainwatch.cli", "serve", "--metrics-port", "0", *args],
                          env=env, capture_output=True, text=True, timeout=timeout)


def test_checker_over_tls_reports_a_divergence_produced_through_the_kafka_sink(
        tls_kafka_broker, tls_env, consistent_invariants, tmp_path):
    tls = tls_kafka_broker
    worker = CheckerProcess(tls.bootstrap, tmp_path / "serve.log",
                            ["--grace-seconds", "1", "--partitions", "4", "-i", consistent_invariants,
                             "--data-dir", str(tmp_path / "checker")], env=tls_env).start()
    try:
        batches = _two_rank_run("run-tls", 5, diverge_from=2)
        expected = _offline_violation_ids(batches, consistent_invariants)
        assert len(expected) == 3  # steps 2, 3, 4

        # The producers' own sink, configured from the same variables a training job gets.
        sink = KafkaSink(tls.bootstrap, EVENTS, settings=kafka_settings_from_env(tls_env))
        for batch in batches:
            sink.write(batch, encode_batch(batch))
        assert sink.wait_delivered(30), sink.last_error
        sink.close()
        stats = sink.stats()
        assert (stats.sent_batches, stats.dropped_batches) == (len(batches), 0), sink.last_error

        def violations() -> list[dict]:
            records = read_topic(tls.bootstrap, VIOLATIONS, security_kwargs=tls.kafka_python_kwargs())
            return [v for v in iter_violations(records) if not v["relation"].startswith("Trend:")]

        wait_until(lambda: {v["id"] for v in violations()} >= expected, 60,
                   what="the divergence's violations on the violations topic, read over TLS")
        found = violations()
        assert sorted(v["id"] for v in found) == sorted(expected)
        assert min(v["step"] for v in found) == 2 and {v["run"] for v in found} == {"run-tls"}

        samples = wait_until(lambda: (m := worker.metrics())
                             and metric(m, "trainwatch_steps_checked_total", run="run-tls") >= 5 and m,
                             30, what="all five steps checked in /metrics")
        assert metric(samples, "trainwatch_violations_total", run="run-tls", relation="Consistent") == 3
        assert metric(samples, "trainwatch_first_violation_step", run="run-tls") == 2
        assert metric(samples, "trainwatch_batches_consumed_total", run="run-tls") == len(batches)
    finally:
        worker.stop()
    # Every client went through the TLS terminator: its log shows the handshakes.
    assert "accepted connection" in tls.terminator.log_path.read_text()


def test_untrusted_certificate_wrong_host_or_unreadable_ca_exit_2_at_once(tls_kafka_broker, tls_env, tmp_path):
    tls = tls_kafka_broker
    other_ca = make_certificates(tmp_path / "other-pki", name="some other").ca_file
    not_pem = tmp_path / "not-a-certificate.pem"
    not_pem.write_text("hello\n")
    port = tls.bootstrap.rpartition(":")[2]
    cases = [
        ("another CA", tls.bootstrap, {"TRAINWATCH_KAFKA_SSL_CAFILE": str(other_ca)},
         "presents a certificate this client does not trust (unable to get local issuer certificate"),
        # the certificate names IP:127.0.0.1 only
        ("another host name", f"localhost:{port}", {},
         "presents a certificate this client does not trust (Hostname mismatch"),
        ("missing CA file", tls.bootstrap, {"TRAINWATCH_KAFKA_SSL_CAFILE": str(tmp_path / "absent.pem")},
         "absent.pem cannot be loaded: No such file or directory"),
        ("CA file without a certificate", tls.bootstrap, {"TRAINWATCH_KAFKA_SSL_CAFILE": str(not_pem)},
         "not-a-certificate.pem cannot be loaded"),
    ]
    for what, bootstrap, overrides, message in cases:
        started = time.monotonic()
        result = _serve(["--bootstrap", bootstrap, "--connect-timeout", "20", "--data-dir", str(tmp_path / "d")],
                        {**tls_env, **overrides})
        elapsed = time.monotonic() - started
        assert result.returncode == 2, (what, result.stderr[-2000:])
        assert message in result.stderr, (what, result.stderr[-2000:])
        assert len(result.stderr.strip().splitlines()) == 1, (what, result.stderr[-2000:])
        # decided by the handshake, not by waiting out the 20 s connect timeout
        assert elapsed < 15, (what, elapsed)


def test_protocol_mismatches_name_the_setting_to_change(tls_kafka_broker, tls_env, clean_env, tmp_path):
    tls = tls_kafka_broker
    # An SSL client at tansu's own plaintext port: kafka-python alone would wait forever.
    started = time.monotonic()
    result = _serve(["--bootstrap", tls.plaintext_bootstrap, "--connect-timeout", "3",
                     "--data-dir", str(tmp_path / "a")], tls_env)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "did not answer the TLS handshake within 3s; is it a plaintext listener?" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and time.monotonic() - started < 30

    # A plaintext client at the TLS port: the clients give up after the connect timeout,
    # and the message says the port speaks TLS.
    started = time.monotonic()
    result = _serve(["--bootstrap", tls.bootstrap, "--connect-timeout", "3", "--data-dir", str(tmp_path / "b")],
                    clean_env)
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"{tls.bootstrap} is a TLS listener: set TRAINWATCH_KAFKA_SECURITY_PROTOCOL=SSL" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and time.monotonic() - started < 30


def test_watch_checks_a_training_job_through_a_tls_cluster(tls_kafka_broker, tls_env):
    """`watch --bootstrap` with the TLS variables: collect's producers, the checker and the
    violation follower all talk TLS; the healthy job's steps are all checked."""
    result = subprocess.run(
        [sys.executable, "-m", "trainwatch.cli", "watch", "--bootstrap", tls_kafka_broker.bootstrap,
         "--run-id", "mlp-tls", "--grace-seconds", "1", "--", sys.executable, str(ROOT / "examples" / "mlp.py"),
         "--steps", "4"],
        env=tls_env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "topic trainwatch.events: no batches dropped" in result.stderr, result.stderr[-3000:]
    summary = re.search(r"run mlp-tls: no violation in (\d+) training iterations \(.*\); training exited 0$",
                        result.stderr.strip().splitlines()[-1])
    assert summary and int(summary.group(1)) >= 4, result.stderr[-3000:]


def test_watch_with_its_embedded_broker_ignores_cluster_security_settings(clean_env, tmp_path):
    """Variables exported for a secured cluster must not break the plaintext embedded broker."""
    env = {**clean_env, "TRAINWATCH_KAFKA_SECURITY_PROTOCOL": "SSL",
           "TRAINWATCH_KAFKA_SSL_CAFILE": str(tmp_path / "cluster-ca.pem")}
    result = subprocess.run([sys.executable, "-m", "trainwatch.cli", "watch", "--", sys.executable,
                             str(ROOT / "examples" / "mlp.py"), "--steps", "2"],
                            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert ("ignoring TRAINWATCH_KAFKA_SECURITY_PROTOCOL, TRAINWATCH_KAFKA_SSL_CAFILE: "
            "the embedded broker is plaintext on loopback") in result.stderr
    assert "(embedded tansu broker)" in result.stderr


def test_a_producer_with_wrong_tls_settings_never_blocks_and_counts_every_drop(tls_kafka_broker, tmp_path):
    """Training must go on when its Kafka settings are wrong: writes return at once and
    whatever cannot be delivered is counted as dropped when the sink closes."""
    tls = tls_kafka_broker
    other_ca = make_certificates(tmp_path / "other-pki", name="some other").ca_file
    wrong = {
        "untrusted certificate": (tls.bootstrap, {**tls.kafka_python_kwargs(), "ssl_cafile": str(other_ca)}),
        "TLS client at a plaintext port": (tls.plaintext_bootstrap, tls.kafka_python_kwargs()),
        "plaintext client at the TLS port": (tls.bootstrap, {}),
    }
    batches = [synthetic_step_batch("run-x", 0, 1, step) for step in range(3)]
    for what, (bootstrap, settings) in wrong.items():
        sink = KafkaSink(bootstrap, EVENTS, settings=settings)
        started = time.monotonic()
        for batch in batches:
            sink.write(batch, encode_batch(batch))
        assert time.monotonic() - started < 5.0, what  # queued, never waited on
        sink.close(timeout_s=1.0)
        stats = sink.stats()
        assert (stats.sent_batches, stats.dropped_batches) == (0, len(batches)), (what, stats)
        assert stats.dropped_events == sum(len(b["events"]) for b in batches), what
        if settings:  # a TLS client: the reason is the handshake, found within the probe's deadline
            reason = wait_until(lambda: sink.last_error, 10, what=f"the reason for {what}")
            assert "TLS" in reason, (what, reason)
