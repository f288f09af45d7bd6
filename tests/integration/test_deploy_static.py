"""The deployment files validate with the real tools and agree with each other.

docker-compose, promtool and amtool come from Debian packages
(`scripts/install-system-deps.sh`); a test skips with the reason when its tool is
absent, and fails instead when TRAINWATCH_REQUIRE_SYSTEM_DEPS=1 (CI).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
SASL_OVERRIDE = ROOT / "deploy" / "kafka" / "external-sasl-ssl.yml"
COMPOSE_OVERRIDES = [SASL_OVERRIDE]
RULES_DIR = DEPLOY / "prometheus" / "rules"
RULE_FILES = sorted(RULES_DIR.glob("*.yml"))
DASHBOARD_FILES = sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))
RUNBOOKS = DEPLOY / "runbooks"
DATASOURCE_UID = "trainwatch-prometheus"

#: The one setting compose cannot default: Grafana must not start with a guessable password.
REQUIRED_SETTINGS = "GRAFANA_ADMIN_PASSWORD=not-the-default\n"


def require_binary(name: str) -> str:
    path = shutil.which(name)
    if path:
        return path
    reason = f"{name} is not installed (bash scripts/install-system-deps.sh installs it)"
    if os.environ.get("TRAINWATCH_REQUIRE_SYSTEM_DEPS") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def run_tool(*argv: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def assert_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"{proc.args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"


# --------------------------------------------------------------------- compose


def compose_check(env_file: Path, tmp_path: Path, *overrides: Path) -> subprocess.CompletedProcess:
    """`docker-compose config -q`, isolated from the caller's environment and from any
    .env a developer keeps in the checkout."""
    binary = require_binary("docker-compose")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}
    files = [arg for path in (COMPOSE, *overrides) for arg in ("-f", str(path))]
    return run_tool(binary, *files, "--env-file", str(env_file), "config", "-q", env=env)


def compose_config(env_file: Path, tmp_path: Path, *overrides: Path) -> dict:
    """`docker-compose config` as docker would resolve it (see `compose_check`)."""
    binary = require_binary("docker-compose")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}
    files = [arg for path in (COMPOSE, *overrides) for arg in ("-f", str(path))]
    check = compose_check(env_file, tmp_path, *overrides)
    assert_ok(check)
    assert check.stdout == "", "config -q printed something"
    proc = run_tool(binary, *files, "--env-file", str(env_file), "config", env=env)
    assert_ok(proc)
    return yaml.safe_load(proc.stdout)


@pytest.fixture(scope="module")
def default_services(tmp_path_factory) -> dict:
    """The compose services with only the required setting: every other variable at its default."""
    tmp = tmp_path_factory.mktemp("compose-defaults")
    minimal = tmp / "minimal.env"
    minimal.write_text(REQUIRED_SETTINGS)
    return compose_config(minimal, tmp)["services"]


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


# --------------------------------------------------------------------- prometheus


def test_promtool_checks_prometheus_config_with_the_rules(tmp_path):
    promtool = require_binary("promtool")
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    config["rule_files"] = [str(RULES_DIR / "*.yml")]  # the same files, at their repository path
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    proc = run_tool(promtool, "check", "config", str(path))
    assert_ok(proc)
    assert f"{len(RULE_FILES)} rule files found" in proc.stdout + proc.stderr

    job = next(j for j in config["scrape_configs"] if j["job_name"] == "trainwatch-checker")
    assert job["dns_sd_configs"][0]["names"] == ["checker"] and job["dns_sd_configs"][0]["port"] == 9464


def test_promtool_checks_rules():
    promtool = require_binary("promtool")
    assert RULE_FILES
    assert_ok(run_tool(promtool, "check", "rules", *map(str, RULE_FILES)))


def test_promtool_rule_unit_tests_pass():
    promtool = require_binary("promtool")
    tests = sorted((DEPLOY / "prometheus" / "tests").glob("*.yml"))
    assert tests
    proc = run_tool(promtool, "test", "rules", *[t.name for t in tests], cwd=tests[0].parent)
    assert_ok(proc)


def load_alerts() -> list[dict]:
    alerts = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            alerts += [rule for rule in group["rules"] if "alert" in rule]
    return alerts


def test_every_alert_has_for_severity_text_and_an_existing_runbook():
    alerts = load_alerts()
    names = {a["alert"] for a in alerts}
    required = {
        "TrainwatchInvariantViolated", "TrainwatchRankStoppedReporting", "TrainwatchCheckerLagging",
        "TrainwatchProducerDroppingEvents", "TrainwatchDeadLettersGrowing", "TrainwatchCheckerDown",
        "TrainwatchRunSilent", "TrainwatchBrokerDown",
    }
    assert required <= names
    for alert in alerts:
        name = alert["alert"]
        assert alert.get("for"), f"{name} has no for:"
        assert alert["labels"]["severity"] in ("page", "warning"), name
        annotations = alert["annotations"]
        assert annotations.get("summary") and annotations.get("description"), name
        runbook = re.fullmatch(r"\{\{ \$externalLabels\.trainwatch_runbook_url \}\}/([a-z-]+\.md)",
                               annotations["runbook_url"])
        assert runbook, f"{name}: runbook_url {annotations['runbook_url']!r}"
        page = RUNBOOKS / runbook.group(1)
        assert page.is_file(), f"{name}: {page} missing"
        assert name in page.read_text(), f"{page.name} does not describe {name}"
        assert name in (RUNBOOKS / "README.md").read_text()
    violated = next(a for a in alerts if a["alert"] == "TrainwatchInvariantViolated")
    assert violated["labels"]["severity"] == "page"
    assert "sum by (run, relation, invariant)" in violated["expr"]
    assert "/d/trainwatch-run/" in violated["annotations"]["dashboard"]
    checker_down = next(a for a in alerts if a["alert"] == "TrainwatchCheckerDown")
    assert checker_down["expr"].strip() == 'up{job="trainwatch-checker"} == 0'


# --------------------------------------------------------------------- alertmanager


def test_amtool_accepts_the_shipped_config_and_its_templates(tmp_path):
    amtool = require_binary("amtool")
    source = DEPLOY / "alertmanager" / "alertmanager.yml"
    text = source.read_text().replace("/etc/alertmanager/templates/", str(DEPLOY / "alertmanager" / "templates") + "/")
    path = tmp_path / "alertmanager.yml"
    path.write_text(text)
    proc = run_tool(amtool, "check-config", str(path))
    assert_ok(proc)
    assert "1 templates" in proc.stdout

    config = yaml.safe_load(text)
    assert config["route"]["group_by"] == ["alertname", "run"]
    assert any(r.get("webhook_configs") for r in config["receivers"])


def uncomment_examples(text: str) -> str:
    """Enable the commented email/Slack/PagerDuty examples, as a user would."""
    out = []
    in_example = False
    for line in text.splitlines():
        if re.match(r"^  # (smtp_|slack_api_url)", line):
            out.append("  " + line[4:])
            continue
        if re.match(r"^  # - name: ", line):
            in_example = True
        elif in_example and not re.match(r"^  #   ", line):
            in_example = False
        out.append("  " + line[4:] if in_example else line)
    return "\n".join(out) + "\n"


def test_amtool_accepts_the_commented_receiver_examples_once_enabled(tmp_path):
    amtool = require_binary("amtool")
    text = (DEPLOY / "alertmanager" / "alertmanager.yml").read_text()
    enabled = uncomment_examples(text).replace(
        "/etc/alertmanager/templates/", str(DEPLOY / "alertmanager" / "templates") + "/"
    )
    config = yaml.safe_load(enabled)
    names = {r["name"] for r in config["receivers"]}
    assert {"oncall-email", "team-slack", "oncall-pagerduty"} <= names
    path = tmp_path / "alertmanager.yml"
    path.write_text(enabled)
    proc = run_tool(amtool, "check-config", str(path))
    assert_ok(proc)
    assert "4 receivers" in proc.stdout


# --------------------------------------------------------------------- grafana


def load_dashboards() -> dict[str, dict]:
    return {path.stem: json.loads(path.read_text()) for path in DASHBOARD_FILES}


def panels_of(dashboard: dict) -> list[dict]:
    panels = []
    for panel in dashboard["panels"]:
        panels.append(panel)
        panels += panel.get("panels", [])
    return panels


def test_grafana_provisioning_points_at_the_mounted_dashboards_and_fixed_datasource(default_services):
    datasources = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    (datasource,) = datasources["datasources"]
    assert datasource["uid"] == DATASOURCE_UID and datasource["type"] == "prometheus"
    providers = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/trainwatch.yaml").read_text())
    path = providers["providers"][0]["options"]["path"]
    grafana = default_services["grafana"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in map(str, grafana["volumes"])}
    assert Path(mounts[path]) == DEPLOY / "grafana" / "dashboards"
    assert Path(mounts["/etc/grafana/provisioning"]) == DEPLOY / "grafana" / "provisioning"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (DEPLOY / "grafana" / "dashboards" / Path(home).name).is_file()
    assert grafana["environment"]["TRAINWATCH_PROMETHEUS_URL"] == "http://prometheus:9090"


def test_dashboards_are_well_formed_and_use_the_provisioned_datasource():
    dashboards = load_dashboards()
    assert {"trainwatch-overview", "trainwatch-run"} <= set(dashboards)
    uids = [d["uid"] for d in dashboards.values()]
    assert len(set(uids)) == len(uids)
    for name, dashboard in dashboards.items():
        assert dashboard["uid"] == name, "file name and uid differ"
        ids = [p["id"] for p in panels_of(dashboard)]
        assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"
        for panel in panels_of(dashboard):
            pos = panel["gridPos"]
            assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24, f"{name}/{panel['title']}"
            if panel["type"] == "row":
                continue
            assert panel["datasource"] == {"type": "prometheus", "uid": DATASOURCE_UID}
            assert panel["targets"], f"{name}/{panel['title']} has no query"
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == DATASOURCE_UID
                assert target["expr"].strip()


def test_run_dashboard_is_driven_by_the_run_variable():
    dashboard = load_dashboards()["trainwatch-run"]
    (variable,) = dashboard["templating"]["list"]
    assert variable["name"] == "run"
    assert variable["query"]["query"] == "label_values(trainwatch_steps_checked_total, run)"
    for panel in panels_of(dashboard):
        for target in panel.get("targets", []):
            assert '"$run"' in target["expr"], f"{panel['title']}: not filtered by run"


def referenced_metrics() -> set[str]:
    exprs = [a["expr"] for a in load_alerts()]
    for dashboard in load_dashboards().values():
        exprs += [t["expr"] for p in panels_of(dashboard) for t in p.get("targets", [])]
    names = set()
    for expr in exprs:
        names |= set(re.findall(r"\btrainwatch_[a-z_]+\b", expr))
    return names


def test_every_metric_in_rules_and_dashboards_is_exported_by_the_checker():
    from prometheus_client import CollectorRegistry

    from stream_checkers import metrics as metrics_module

    registry = CollectorRegistry()
    metrics_module.CheckerMetrics(registry)
    exported = set()
    for family in registry.collect():
        exported.add(family.name)
        exported |= {sample.name for sample in family.samples}
        if family.type == "counter":
            exported.add(family.name + "_total")
        if family.type == "histogram":
            exported |= {family.name + suffix for suffix in ("_bucket", "_sum", "_count")}
    missing = referenced_metrics() - exported
    assert not missing, f"rules/dashboards use metrics the checker does not export: {sorted(missing)}"
