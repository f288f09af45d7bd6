"""The deployment files and the tools that validate them, shared by the deploy tests.

The compose, monitoring and end-to-end tests read the same shipped files and call
the same Debian tools, so the paths and the skip-or-fail rule for a missing tool
live in one place.
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



def load_alerts() -> list[dict]:
    alerts = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            alerts += [rule for rule in group["rules"] if "alert" in rule]
    return alerts



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



def load_dashboards() -> dict[str, dict]:
    return {path.stem: json.loads(path.read_text()) for path in DASHBOARD_FILES}


def panels_of(dashboard: dict) -> list[dict]:
    panels = []
    for panel in dashboard["panels"]:
        panels.append(panel)
        panels += panel.get("panels", [])
    return panels

