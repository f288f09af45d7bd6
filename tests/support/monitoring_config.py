"""The shipped Prometheus and Alertmanager configuration, changed only where it
cannot apply on loopback, for the end-to-end deploy test.

Docker DNS discovery becomes a static loopback target, the webhook URL points at the
test's receiver, intervals are short and every alert's `for:` is 1s; expressions,
templates and routing stay as shipped, so the test exercises what users deploy.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.support.deploy_files import COMPOSE, DEPLOY, RULE_FILES, uncomment_examples

GRAFANA_URL = "http://grafana.test"
RUNBOOK_URL = "http://runbooks.test"


def interpolate_defaults(value: str) -> str:
    """Compose's `${VAR:-default}` with no .env: the default."""
    return re.sub(r"\$\{[A-Z0-9_]+(?::?-([^}]*))?\}", lambda m: m.group(1) or "", value)


def compose_settings(service_name: str, overrides: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """A compose service's command and environment from docker-compose.yml, with what
    must differ on loopback overridden; every other variable is passed as shipped
    (e.g. the checker's empty TRAINWATCH_INVARIANTS = the shipped invariant set)."""
    service = yaml.safe_load(COMPOSE.read_text())["services"][service_name]
    environment = {name: interpolate_defaults(str(value)) for name, value in service["environment"].items()}
    missing = set(overrides) - set(environment)
    assert not missing, f"the compose service {service_name} does not set {missing}"
    environment.update(overrides)
    return [interpolate_defaults(str(arg)) for arg in service["command"]], environment


def prometheus_settings() -> tuple[list[str], dict[str, str]]:
    """The feature flags and environment of the compose Prometheus: the links in alert
    annotations come from external labels expanded from these variables."""
    command, environment = compose_settings(
        "prometheus", {"TRAINWATCH_GRAFANA_URL": GRAFANA_URL, "TRAINWATCH_RUNBOOK_URL": RUNBOOK_URL})
    return [arg for arg in command if arg.startswith("--enable-feature=")], environment


def rules_with_short_for(target_dir: Path) -> list[Path]:
    """The shipped rule files with every `for:` set to 1s; expressions untouched."""
    target_dir.mkdir()
    paths = []
    for source in RULE_FILES:
        document = yaml.safe_load(source.read_text())
        for group in document["groups"]:
            group["interval"] = "1s"
            for rule in group["rules"]:
                if "for" in rule:
                    rule["for"] = "1s"
        path = target_dir / source.name
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        paths.append(path)
    return paths


def prometheus_config(rules_dir: Path, checker_port: int, alertmanager_port: int, prometheus_port: int) -> dict:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    # external_labels stay as shipped: ${...} placeholders that Prometheus expands from
    # its environment (see prometheus_settings).
    config["rule_files"] = [str(rules_dir / "*.yml")]
    config["alerting"]["alertmanagers"] = [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager_port}"]}]}]
    targets = {
        "trainwatch-checker": f"127.0.0.1:{checker_port}",
        "prometheus": f"127.0.0.1:{prometheus_port}",
        "alertmanager": f"127.0.0.1:{alertmanager_port}",
    }
    for job in config["scrape_configs"]:
        job.pop("dns_sd_configs", None)
        job["static_configs"] = [{"targets": [targets[job["job_name"]]]}]
        job["scrape_interval"] = "1s"
    return config


def alertmanager_config(webhook_url: str) -> dict:
    """The shipped config; its webhook and the (enabled) Slack example both deliver to
    the receiver, so the shipped notification templates render real alerts."""
    config = yaml.safe_load((DEPLOY / "alertmanager" / "alertmanager.yml").read_text())
    examples = yaml.safe_load(uncomment_examples((DEPLOY / "alertmanager" / "alertmanager.yml").read_text()))
    slack = next(r for r in examples["receivers"] if r["name"] == "team-slack")["slack_configs"][0]
    slack["api_url"] = webhook_url + "/slack"
    config["templates"] = [str(DEPLOY / "alertmanager" / "templates" / "*.tmpl")]
    routes = [config["route"], *config["route"].get("routes", [])]
    for route in routes:
        route.update(group_wait="1s", group_interval="1s")
    for receiver in config["receivers"]:
        for webhook in receiver.get("webhook_configs", []):
            webhook["url"] = webhook_url
            receiver["slack_configs"] = [slack]
    return config

