"""End to end: a buggy training run, checked live, pages through Prometheus and Alertmanager.

Everything is real and on loopback ports this module picks: the tansu broker, a
`trainwatch serve` worker (run with torch made unimportable, as in the slim checker
image), a 2-rank DDP job with a silently diverging replica under `trainwatch collect
--bootstrap`, the Debian `prometheus` and `prometheus-alertmanager` binaries, and a
webhook receiver in this process.  Prometheus and Alertmanager run the shipped
configuration, with only what cannot apply here changed: Docker DNS discovery becomes
a static loopback target, the webhook URL points at the receiver, intervals are short,
and every alert's `for:` is 1s (expressions are used verbatim).  The checker and
Prometheus get the command line flags and environment of their compose services.

Besides the training run, a few hand-made batches on the events topic (wire contract
of `invariants.events`) create what a healthy run does not: a malformed message, a
rank that never reports, a late batch, producer drops, a NaN loss and DataLoader
workers that never report — so that every dashboard query and every pipeline alert
meets real data.
"""

from __future__ import annotations

import json
import os
import urllib.request
from typing import Any, Callable

import pytest

from tests.support.deploy_files import (
    DASHBOARD_FILES,
    panels_of,
    require_binary,
)
from tests.support.monitoring_config import GRAFANA_URL, RUNBOOK_URL
from tests.support.monitoring_stack import (
    PIPELINE_RUN,
    TRAINING_RUN,
    ManagedProcess,
    Stack,
    WebhookReceiver,
    alive,
    free_port,
    http_json,
    publish_pipeline_faults,
    start_alertmanager,
    start_checker,
    start_prometheus,
    training_run,
    wait_until,
)

pytestmark = pytest.mark.slow

# Grafana's interval variables, as the panels would get them at a 1s scrape interval.
GRAFANA_VARIABLES = {"$__rate_interval": "30s", "$__interval": "5s", "$__range": "1h"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Stack:
    prometheus_binary = require_binary("prometheus")
    alertmanager_binary = require_binary("prometheus-alertmanager")
    from kafka import KafkaProducer

    from stream_checkers.embedded_broker import EmbeddedBroker

    tmp = tmp_path_factory.mktemp("deploy-e2e")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINWATCH_")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    broker = EmbeddedBroker(log_path=tmp / "broker.log").start()
    webhook = WebhookReceiver().start()
    processes: list[ManagedProcess] = []
    try:
        checker_port, prometheus_port, alertmanager_port = free_port(), free_port(), free_port()
        checker = start_checker(tmp, env, broker.bootstrap, checker_port)
        processes.append(checker)
        training = training_run(tmp, env, broker.bootstrap)
        processes.append(training)
        alertmanager = start_alertmanager(alertmanager_binary, tmp, webhook.url, alertmanager_port)
        processes.append(alertmanager)
        prometheus = start_prometheus(prometheus_binary, tmp, env, checker_port, alertmanager_port, prometheus_port)
        processes.append(prometheus)
        stack = Stack(
            prometheus_url=f"http://127.0.0.1:{prometheus_port}",
            alertmanager_url=f"http://127.0.0.1:{alertmanager_port}",
            checker_metrics_url=f"http://127.0.0.1:{checker_port}/metrics",
            webhook=webhook,
            processes=processes,
        )

        def checker_metrics() -> bool:
            return b"trainwatch_build_info" in urllib.request.urlopen(stack.checker_metrics_url, timeout=2).read()

        wait_until(alive(checker, checker_metrics), 60, "the checker's /metrics", stack.diagnose)
        training.start()  # the checker reads from the earliest offset, so it may still be joining
        wait_until(alive(alertmanager, lambda: urllib.request.urlopen(f"{stack.alertmanager_url}/-/ready",
                                                                      timeout=2).status == 200),
                   30, "Alertmanager ready", stack.diagnose)
        wait_until(alive(prometheus, lambda: stack.vector('up{job="trainwatch-checker"} == 1')), 30,
                   "Prometheus scraping the checker", stack.diagnose)

        def pipeline_step_closed() -> bool:
            return bool(stack.vector(f'trainwatch_missing_rank_windows_total{{run="{PIPELINE_RUN}"}} > 0'))

        publish_pipeline_faults(KafkaProducer(bootstrap_servers=broker.bootstrap, acks=1), pipeline_step_closed)
        wait_until(lambda: training.proc.poll() is not None, 150, "the training run to finish", stack.diagnose)
        assert training.proc.returncode == 0, stack.diagnose()
        yield stack
    finally:
        for process in reversed(processes):
            process.stop()
        webhook.stop()
        broker.stop()


# ------------------------------------------------------------------ tests


def test_violation_alert_fires_and_alertmanager_delivers_it_to_the_webhook(stack: Stack):
    # The checker found the diverging replica ...
    violations = wait_until(lambda: stack.vector(f'trainwatch_violations_total{{run="{TRAINING_RUN}"}} > 0'),
                            60, "a violation of the training run", stack.diagnose)
    violated = {(v["metric"]["relation"], v["metric"]["invariant"]) for v in violations}
    first_step = stack.vector(f'trainwatch_first_violation_step{{run="{TRAINING_RUN}"}}')
    assert first_step and float(first_step[0]["value"][1]) >= 2  # the bug starts after --perturb-step 2

    # ... Prometheus fires the shipped alert with its labels ...
    def firing() -> list[dict[str, Any]]:
        alerts = http_json(f"{stack.prometheus_url}/api/v1/alerts")["data"]["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == "TrainwatchInvariantViolated"
                and a["labels"].get("run") == TRAINING_RUN and a["state"] == "firing"]

    alerts = wait_until(firing, 30, "TrainwatchInvariantViolated firing in Prometheus", stack.diagnose)
    assert {(a["labels"]["relation"], a["labels"]["invariant"]) for a in alerts} <= violated
    assert all(a["labels"]["severity"] == "page" for a in alerts)

    # ... and Alertmanager delivers it to the webhook receiver, grouped by run.
    def delivered() -> list[dict[str, Any]]:
        return [a for a in stack.webhook.firing_alerts()
                if a["labels"].get("alertname") == "TrainwatchInvariantViolated"
                and a["labels"].get("run") == TRAINING_RUN]

    received = wait_until(delivered, 30, "the violation notification at the webhook", stack.diagnose)
    alert = received[0]
    assert alert["labels"]["trainwatch_grafana_url"] == GRAFANA_URL  # expanded external labels ride along
    assert alert["annotations"]["dashboard"] == f"{GRAFANA_URL}/d/trainwatch-run/trainwatch-run?var-run={TRAINING_RUN}"
    assert alert["annotations"]["runbook_url"] == f"{RUNBOOK_URL}/invariant-violated.md"
    assert TRAINING_RUN in alert["annotations"]["summary"]
    assert "first violated an invariant at step" in alert["annotations"]["description"]
    payload = next(n["payload"] for n in stack.webhook.notifications
                   if any(a is alert for a in n["payload"].get("alerts", [])))
    assert payload["groupLabels"] == {"alertname": "TrainwatchInvariantViolated", "run": TRAINING_RUN}

    # The shipped templates, through the Slack example, render the same alert.
    def slack_message() -> list[dict[str, Any]]:
        return [m for m in stack.webhook.slack_messages()
                if m.get("title", "").endswith(f"TrainwatchInvariantViolated in run {TRAINING_RUN}")]

    message = wait_until(slack_message, 30, "the Slack-format notification", stack.diagnose)[0]
    assert message["title"].startswith("[FIRING:")
    assert message["title_link"] == alert["annotations"]["dashboard"]
    assert alert["annotations"]["summary"] in message["text"]
    assert f"Runbook: {RUNBOOK_URL}/invariant-violated.md" in message["text"]


def test_pipeline_alerts_fire_on_the_checkers_real_metrics(stack: Stack):
    expected = {
        "TrainwatchRankStoppedReporting": {"run": PIPELINE_RUN},
        "TrainwatchProducerDroppingEvents": {"run": PIPELINE_RUN},
        "TrainwatchDeadLettersGrowing": {"reason": "undecodable"},
        "TrainwatchTrendBroken": {"run": PIPELINE_RUN, "rule": "nonfinite_loss"},
    }

    def all_firing() -> bool:
        alerts = http_json(f"{stack.prometheus_url}/api/v1/alerts")["data"]["alerts"]
        firing = [a["labels"] for a in alerts if a["state"] == "firing"]
        return all(any(all(labels.get(k) == v for k, v in want.items()) and labels["alertname"] == name
                       for labels in firing)
                   for name, want in expected.items())

    wait_until(all_firing, 30, f"{sorted(expected)} firing", stack.diagnose)
    assert stack.vector(f'trainwatch_late_batches_total{{run="{PIPELINE_RUN}"}} > 0')
    # A healthy pipeline with one replica up must not page about missing checkers.
    alerts = http_json(f"{stack.prometheus_url}/api/v1/alerts")["data"]["alerts"]
    names = {a["labels"]["alertname"] for a in alerts}
    assert not names & {"TrainwatchNoCheckerRunning", "TrainwatchCheckerDown"}


def dashboard_queries() -> list[tuple[str, str, str, str]]:
    """(dashboard uid, panel title, refId, expr) for every query of every panel."""
    queries = []
    for path in DASHBOARD_FILES:
        dashboard = json.loads(path.read_text())
        for panel in panels_of(dashboard):
            for target in panel.get("targets", []):
                queries.append((dashboard["uid"], panel["title"], target["refId"], target["expr"]))
    return queries


def substitute(expr: str, run: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    expr = expr.replace("$run", run)
    assert "$" not in expr, f"unsubstituted variable in {expr}"
    return expr


def test_every_dashboard_query_is_valid_and_returns_data(stack: Stack):
    # Both runs must show up in the run dashboard's variable.
    runs = {v["metric"]["run"] for v in stack.vector("group by (run) (trainwatch_steps_checked_total)")}
    assert {TRAINING_RUN, PIPELINE_RUN} <= runs
    # The alert-driven panels need the alerts to be firing first.
    wait_until(lambda: stack.vector(f'ALERTS{{alertstate="firing", run="{TRAINING_RUN}"}}'), 30,
               "firing alerts for the training run", stack.diagnose)

    empty = []
    for uid, title, ref, expr in dashboard_queries():
        results_by_run = {}
        for run in ([TRAINING_RUN, PIPELINE_RUN] if "$run" in expr else [""]):
            answer = stack.query(substitute(expr, run))
            assert answer["status"] == "success", f"{uid} / {title} / {ref}: {answer}"
            results_by_run[run] = answer["data"]["result"]
        # A per-run query must return data for the run it is about: the violation
        # panels for the buggy training run, the drop/late/missing-rank/trend and
        # producer-overhead panels for the faulty pipeline run.
        if not any(results_by_run.values()):
            empty.append(f"{uid} / {title} / {ref}: {expr}")
    assert not empty, "dashboard queries without data:\n" + "\n".join(empty)


# Stops the checker, so it runs last in this module (pytest keeps file order).
def test_checker_down_pages_and_alertmanager_inhibits_the_per_replica_alert(stack: Stack):
    checker = next(p for p in stack.processes if p.name == "checker")
    checker.stop()

    def prometheus_firing(name: str) -> Callable[[], bool]:
        def check() -> bool:
            alerts = http_json(f"{stack.prometheus_url}/api/v1/alerts")["data"]["alerts"]
            return any(a["labels"]["alertname"] == name and a["state"] == "firing" for a in alerts)
        return check

    wait_until(prometheus_firing("TrainwatchCheckerDown"), 30, "TrainwatchCheckerDown firing", stack.diagnose)
    wait_until(prometheus_firing("TrainwatchNoCheckerRunning"), 30, "TrainwatchNoCheckerRunning firing",
               stack.diagnose)

    # Alertmanager holds the per-replica warning back while "no checker at all" pages.
    def checker_down_inhibited() -> bool:
        alerts = http_json(f"{stack.alertmanager_url}/api/v2/alerts?inhibited=true")
        return any(a["labels"]["alertname"] == "TrainwatchCheckerDown"
                   and a["status"]["state"] == "suppressed" and a["status"]["inhibitedBy"]
                   for a in alerts)

    wait_until(checker_down_inhibited, 30, "TrainwatchCheckerDown inhibited in Alertmanager", stack.diagnose)

    def paged() -> list[dict[str, Any]]:
        return [a for a in stack.webhook.firing_alerts() if a["labels"]["alertname"] == "TrainwatchNoCheckerRunning"]

    page = wait_until(paged, 30, "the no-checker page at the webhook", stack.diagnose)[0]
    assert page["labels"]["severity"] == "page"
    assert page["annotations"]["runbook_url"] == f"{RUNBOOK_URL}/checker-down.md"
    assert not [a for a in stack.webhook.firing_alerts() if a["labels"]["alertname"] == "TrainwatchCheckerDown"]
