"""Prometheus rules, Alertmanager configuration, runbooks and Grafana dashboards
validate with the real tools and agree with the metrics the checker exports.

promtool and amtool come from Debian packages (`scripts/install-system-deps.sh`); a
test skips with the reason when its tool is absent, and fails instead when
TRAINWATCH_REQUIRE_SYSTEM_DEPS=1 (CI).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.support.deploy_files import (
    DATASOURCE_UID,
    DEPLOY,
    RULE_FILES,
    RULES_DIR,
    RUNBOOKS,
    assert_ok,
    load_alerts,
    load_dashboards,
    panels_of,
    require_binary,
    run_tool,
    uncomment_examples,
)


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
