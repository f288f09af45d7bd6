"""docker-compose.yml, its .env example and override, the checker image and the
topic script agree with each other and with what the checkers need.

docker-compose comes from a Debian package (`scripts/install-system-deps.sh`); a test
skips with the reason when it is absent, and fails instead when
TRAINWATCH_REQUIRE_SYSTEM_DEPS=1 (CI).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from tests.support.deploy_files import (
    COMPOSE,
    COMPOSE_OVERRIDES,
    DEPLOY,
    ENV_EXAMPLE,
    REQUIRED_SETTINGS,
    ROOT,
    SASL_OVERRIDE,
    assert_ok,
    compose_check,
    compose_config,
    run_tool,
)


def published_ports(service: dict) -> list[tuple[str, str, str]]:
    """(host_ip, host_port, container_port) for the short and the long port syntax."""
    result = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            result.append((str(port.get("host_ip", "")), str(port.get("published", "")), str(port["target"])))
            continue
        spec = str(port).split("/")[0]
        parts = spec.split(":")
        if len(parts) == 3:
            result.append((parts[0], parts[1], parts[2]))
        elif len(parts) == 2:
            result.append(("", parts[0], parts[1]))
        else:
            result.append(("", "", parts[0]))
    return result


def test_compose_validates_with_only_the_grafana_password_and_binds_every_port_to_loopback(default_services):
    services = default_services
    assert {"kafka", "kafka-init", "checker", "prometheus", "alertmanager", "grafana"} <= set(services)
    for name, service in services.items():
        for host_ip, host_port, _target in published_ports(service):
            assert host_ip == "127.0.0.1", f"{name} publishes {host_port} on {host_ip or 'all interfaces'}"
    assert published_ports(services["grafana"]) == [("127.0.0.1", "3000", "3000")]
    assert published_ports(services["kafka"]) == [("127.0.0.1", "9092", "9092")]
    assert "EXTERNAL://localhost:9092" in services["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert services["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == "not-the-default"


def test_compose_refuses_to_start_grafana_without_an_admin_password(tmp_path):
    for settings in ("", "GRAFANA_ADMIN_PASSWORD=\n", ENV_EXAMPLE.read_text()):  # unset, empty, the example
        env_file = tmp_path / "no-password.env"
        env_file.write_text(settings)
        refused = compose_check(env_file, tmp_path)
        assert refused.returncode != 0
        assert "set GRAFANA_ADMIN_PASSWORD in .env" in refused.stderr, refused.stderr


def test_kafka_accepts_every_batch_the_checkers_accept(default_services):
    from stream_checkers.config import CheckerConfig

    # the checker's own producer may send up to max_batch_bytes + 1 KiB (app.py), plus record overhead
    limit = int(default_services["kafka"]["environment"]["KAFKA_MESSAGE_MAX_BYTES"])
    assert limit >= CheckerConfig.max_batch_bytes + 64 * 1024
    example = dict(line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines()
                   if line and not line.startswith("#") and "=" in line)
    assert int(example["KAFKA_MESSAGE_MAX_BYTES"]) == limit


def test_compose_checker_scales_and_waits_for_topics(default_services):
    checker = default_services["checker"]
    # `docker compose up --scale checker=N` fails with a fixed name or host port.
    assert "container_name" not in checker
    assert not checker.get("ports")
    assert "9464" in [str(p) for p in checker.get("expose", [])]
    assert checker["depends_on"]["kafka-init"]["condition"] == "service_completed_successfully"
    assert checker["depends_on"]["kafka"]["condition"] == "service_healthy"
    env = checker["environment"]
    assert env["TRAINWATCH_BOOTSTRAP"] == "kafka:19092"
    assert env["TRAINWATCH_METRICS_HOST"] == "0.0.0.0"
    assert str(env["TRAINWATCH_METRICS_PORT"]) == "9464"


def test_compose_every_long_running_service_has_healthcheck_restart_and_limits(default_services):
    services = default_services
    for name, service in services.items():
        if name == "kafka-init":
            assert service.get("restart") in ("no", None)
            continue
        assert service.get("restart") == "unless-stopped", name
        assert service.get("healthcheck", {}).get("test"), f"{name} has no health check"
        limits = service.get("deploy", {}).get("resources", {}).get("limits", {})
        assert limits.get("memory") and limits.get("cpus"), f"{name} has no resource limits"
    volumes = {v.split(":")[0] for s in services.values() for v in map(str, s.get("volumes", []))}
    assert {"kafka-data", "prometheus-data", "alertmanager-data", "grafana-data"} <= volumes


def test_env_example_documents_every_compose_variable_and_overrides_apply(tmp_path):
    used = set()
    for path in (COMPOSE, *COMPOSE_OVERRIDES):
        used |= set(re.findall(r"\$\{([A-Z0-9_]+)(?::?[-?][^}]*)?\}", path.read_text()))
    documented = {
        line.split("=", 1)[0]
        for line in ENV_EXAMPLE.read_text().splitlines()
        if line and not line.startswith("#") and "=" in line
    }
    assert used - documented == set(), "compose variables missing from .env.example"
    assert documented - used - {"COMPOSE_PROJECT_NAME"} == set(), ".env.example documents unused variables"

    overridden = tmp_path / "custom.env"
    overridden.write_text(
        ENV_EXAMPLE.read_text()
        + "\nPROMETHEUS_BIND=0.0.0.0\nPROMETHEUS_PORT=19090\nKAFKA_EXTERNAL_HOST=kafka.cluster.example"
        "\nKAFKA_EXTERNAL_PORT=29092\nKAFKA_EXTERNAL_BIND=10.1.2.3\nGRAFANA_BIND=0.0.0.0"
        "\nTRAINWATCH_PARTITIONS=12\nGRAFANA_ADMIN_PASSWORD=s3cret\n"
    )
    services = compose_config(overridden, tmp_path)["services"]
    assert published_ports(services["prometheus"]) == [("0.0.0.0", "19090", "9090")]
    assert published_ports(services["kafka"]) == [("10.1.2.3", "29092", "9092")]
    assert published_ports(services["grafana"]) == [("0.0.0.0", "3000", "3000")]
    kafka_env = services["kafka"]["environment"]
    assert "EXTERNAL://kafka.cluster.example:29092" in kafka_env["KAFKA_ADVERTISED_LISTENERS"]
    # checkers and the topic initialiser must agree on the partition count
    assert str(services["checker"]["environment"]["TRAINWATCH_PARTITIONS"]) == "12"
    assert str(services["kafka-init"]["environment"]["TRAINWATCH_PARTITIONS"]) == "12"
    assert services["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == "s3cret"


def test_sasl_ssl_override_secures_only_the_external_listener(tmp_path):
    env_file = tmp_path / "sasl.env"
    env_file.write_text(REQUIRED_SETTINGS + "KAFKA_EXTERNAL_USERNAME=job\n")
    refused = compose_check(env_file, tmp_path, SASL_OVERRIDE)  # no default login password
    assert refused.returncode != 0 and "set KAFKA_EXTERNAL_PASSWORD in .env" in refused.stderr
    env_file.write_text(REQUIRED_SETTINGS + "KAFKA_EXTERNAL_USERNAME=job\nKAFKA_EXTERNAL_PASSWORD=pa55\n")
    kafka = compose_config(env_file, tmp_path, SASL_OVERRIDE)["services"]["kafka"]
    env = kafka["environment"]
    protocols = dict(item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert protocols == {"CONTROLLER": "PLAINTEXT", "INTERNAL": "PLAINTEXT", "EXTERNAL": "SASL_SSL"}
    assert 'user_job="pa55";' in env["KAFKA_LISTENER_NAME_EXTERNAL_PLAIN_SASL_JAAS_CONFIG"]
    keystore = env["KAFKA_LISTENER_NAME_EXTERNAL_SSL_KEYSTORE_LOCATION"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in map(str, kafka["volumes"])}
    assert Path(keystore).parent.as_posix() in mounts
    assert Path(mounts[Path(keystore).parent.as_posix()]) == DEPLOY / "kafka" / "secrets"
    # the base file's volumes survive the merge
    assert "/var/lib/kafka/data" in mounts


def test_compose_mounts_exist_in_the_repository(default_services):
    for name, service in default_services.items():
        for volume in map(str, service.get("volumes", [])):
            source = volume.split(":")[0]
            if source.startswith("/"):
                assert Path(source).exists(), f"{name} mounts missing {source}"


# --------------------------------------------------------------------- checker image


def test_checker_image_gets_every_package_and_no_torch():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    # the image installs only the hard dependencies: torch must stay optional
    assert not [d for d in project["project"]["dependencies"] if re.match(r"torch\b", d)]
    packages = [p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]]
    dockerfile = (ROOT / "Dockerfile").read_text()
    allowed = (ROOT / ".dockerignore").read_text().splitlines()
    for package in packages:
        assert f"COPY {package} ./{package}" in dockerfile, f"Dockerfile does not copy {package}/"
        assert f"!{package}/" in allowed, f".dockerignore excludes {package}/"
    for module in project["tool"]["setuptools"].get("py-modules", []):
        assert f"COPY {module}.py ./" in dockerfile, f"Dockerfile does not copy {module}.py"
        assert f"!{module}.py" in allowed, f".dockerignore excludes {module}.py"
    assert 'ENTRYPOINT ["trainwatch"]' in dockerfile and 'CMD ["serve"]' in dockerfile
    assert "\nUSER trainwatch\n" in dockerfile  # not root


# --------------------------------------------------------------------- kafka-init


def test_create_topics_script_creates_co_partitioned_topics_and_reports_mismatch(tmp_path):
    """Kafka itself cannot run here, so the script drives a stand-in kafka-topics that
    records its arguments and answers --describe from a file."""
    script = DEPLOY / "kafka" / "create-topics.sh"
    assert_ok(run_tool("bash", "-n", str(script)))
    calls = tmp_path / "calls.log"
    existing = tmp_path / "existing"
    stand_in = tmp_path / "kafka-topics.sh"
    stand_in.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$*" >> {calls}\n'
        'topic=""; parts=""; prev=""\n'
        'for a in "$@"; do\n'
        '  [ "$prev" = --topic ] && topic="$a"\n'
        '  [ "$prev" = --partitions ] && parts="$a"\n'
        '  prev="$a"\n'
        "done\n"
        f'store={existing}/"$topic"\n'
        'if [[ " $* " == *" --create "* ]]; then [ -f "$store" ] || echo "$parts" > "$store"; exit 0; fi\n'
        'echo "Topic: $topic	TopicId: x	PartitionCount: $(cat "$store")	ReplicationFactor: 1"\n'
    )
    stand_in.chmod(0o755)
    existing.mkdir()
    env = {**os.environ, "KAFKA_TOPICS_BIN": str(stand_in), "TRAINWATCH_PARTITIONS": "6",
           "TRAINWATCH_TOPIC_PREFIX": "tw.", "KAFKA_BOOTSTRAP": "kafka:19092"}
    proc = run_tool("bash", str(script), env=env)
    assert_ok(proc)
    created = {p.name: int(p.read_text()) for p in existing.iterdir()}
    assert created == {"tw.events": 6, "tw.step-summaries": 6, "tw.window-ticks": 6,
                       "tw.violations": 6, "tw.dead-letter": 1}
    assert "retention.ms=" in calls.read_text()

    # A second start with another partition count must refuse, not silently differ.
    env["TRAINWATCH_PARTITIONS"] = "8"
    proc = run_tool("bash", str(script), env=env)
    assert proc.returncode == 1
    assert "tw.events has 6 partitions, expected 8" in proc.stderr

    env["TRAINWATCH_PARTITIONS"] = "zero"
    proc = run_tool("bash", str(script), env=env)
    assert proc.returncode == 2 and "positive integer" in proc.stderr
