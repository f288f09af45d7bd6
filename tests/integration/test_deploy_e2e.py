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
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import pytest

import yaml

from tests.support.deploy_files import (
    COMPOSE,
    DASHBOARD_FILES,
    DEPLOY,
    RULE_FILES,
    panels_of,
    require_binary,
    uncomment_examples,
)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TRAINING_RUN = "e2e-ddp-divergence"
PIPELINE_RUN = "e2e-pipeline-faults"
GRAFANA_URL = "http://grafana.test"
RUNBOOK_URL = "http://runbooks.test"
PARTITIONS = 4
# Grafana's interval variables, as the panels would get them at a 1s scrape interval.
GRAFANA_VARIABLES = {"$__rate_interval": "30s", "$__interval": "5s", "$__range": "1h"}
BLOCK_TORCH = "import sys; sys.modules['torch'] = None; from trainwatch.cli import main; sys.exit(main())"


# ------------------------------------------------------------------ small helpers


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str, diagnose: Callable[[], str] = lambda: "") -> Any:
    """Poll until `predicate` returns something truthy; fail with `what` after the deadline.

    Other exceptions mean "not ready yet" (connection refused while a server starts);
    an AssertionError is a verdict (a child exited, a query was rejected) and fails now.
    """
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except AssertionError as exc:
            pytest.fail(f"while waiting for {what}: {exc}\n{diagnose()}")
        except Exception as exc:
            last_error = exc
        time.sleep(0.25)
    pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what} (last error: {last_error!r})\n{diagnose()}")


def free_port() -> int:
    from stream_checkers.embedded_broker import free_port as pick

    return pick()


def http_json(url: str, data: dict[str, str] | None = None, timeout: float = 5.0) -> Any:
    body = urllib.parse.urlencode(data).encode() if data is not None else None
    with urllib.request.urlopen(url, data=body, timeout=timeout) as response:
        return json.loads(response.read())


@dataclass
class ManagedProcess:
    """A child process in its own session, so that stopping it also stops what it started."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    cwd: Path | None = None
    proc: subprocess.Popen | None = field(default=None, repr=False)

    def start(self) -> "ManagedProcess":
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            self.argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=self.env, cwd=self.cwd, start_new_session=True,
        )
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return f"--- {self.name} log ({self.log_path}) ---\n" + "\n".join(text)

    def stop(self, timeout_s: float = 10.0) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=timeout_s)
        if hasattr(self, "_log"):
            self._log.close()


class WebhookReceiver:
    """Alertmanager's webhook target: records every notification it is sent."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server naming)
                length = int(self.headers.get("Content-Length", "0"))
                payload = json.loads(self.rfile.read(length) or b"{}")
                with receiver._lock:
                    receiver.notifications.append({"path": self.path, "payload": payload})
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/trainwatch/alerts"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> "WebhookReceiver":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def firing_alerts(self) -> list[dict[str, Any]]:
        """Alerts of the webhook notifications (Alertmanager's JSON, version 4)."""
        with self._lock:
            return [
                alert
                for note in self.notifications
                for alert in note["payload"].get("alerts", [])
                if alert.get("status") == "firing"
            ]

    def slack_messages(self) -> list[dict[str, Any]]:
        """Attachments of the Slack-format notifications, as Slack would receive them."""
        with self._lock:
            return [
                attachment
                for note in self.notifications
                if note["path"].endswith("/slack")
                for attachment in note["payload"].get("attachments", [])
            ]


# ------------------------------------------------------------------ configuration copies


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


# ------------------------------------------------------------------ the hand-made batches


def _event(kind: str, **fields: Any) -> dict[str, Any]:
    return {"kind": kind, "t": time.time_ns(), "pid": os.getpid(), "tid": 1, "stage": "train", **fields}


def publish_pipeline_faults(producer: Any, step_closed: Callable[[], bool]) -> None:
    """A 2-rank run in which rank 1 never reports step 0 in time, the loss is NaN, the
    producer admits dropping events and step 1's DataLoader workers never report; plus
    one message that is not a batch at all."""
    from invariants.codec import encode_batch
    from invariants.events import batch_key, make_batch

    topic = "trainwatch.events"
    rank0 = make_batch(run=PIPELINE_RUN, rank=0, world=2, step=0, seq=0, events=[
        _event("meta", what="run_start"),
        _event("step", phase="begin"),
        _event("call", name="torch.Tensor.backward", phase="pre", cid=1, parent=None,
               args={"self": {"T": "tensor", "shape": [], "dtype": "float32", "value": math.nan}}),
        _event("meta", what="producer_stats", dropped_events=7, dropped_batches=1),
        _event("step", phase="end"),
    ])
    producer.send(topic, key=batch_key(PIPELINE_RUN, 0), value=encode_batch(rank0))
    # Step 1: both ranks report, but the DataLoader worker each announced never does.
    for rank in (0, 1):
        step1 = make_batch(run=PIPELINE_RUN, rank=rank, world=2, step=1, seq=1, events=[
            _event("step", phase="begin"), _event("meta", what="dataloader_workers", workers=1),
            _event("step", phase="end"),
        ])
        producer.send(topic, key=batch_key(PIPELINE_RUN, 1), value=encode_batch(step1))
    producer.send(topic, key=b"not-a-run:0", value=b"\xc1 this is not msgpack")
    producer.flush(timeout=10)
    # Rank 1 reports only after the grace period closed the window without it.
    wait_until(step_closed, 30, "the checker to close step 0 of the pipeline run with a rank missing")
    rank1 = make_batch(run=PIPELINE_RUN, rank=1, world=2, step=0, seq=0, events=[
        _event("step", phase="begin"), _event("step", phase="end"),
    ])
    producer.send(topic, key=batch_key(PIPELINE_RUN, 0), value=encode_batch(rank1))
    producer.flush(timeout=10)
    producer.close(timeout=5)


# ------------------------------------------------------------------ the stack


@dataclass
class Stack:
    prometheus_url: str
    alertmanager_url: str
    checker_metrics_url: str
    webhook: WebhookReceiver
    processes: list[ManagedProcess]

    def query(self, expr: str) -> dict[str, Any]:
        return http_json(f"{self.prometheus_url}/api/v1/query", {"query": expr})

    def vector(self, expr: str) -> list[dict[str, Any]]:
        answer = self.query(expr)
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def diagnose(self) -> str:
        return "\n".join(p.log_tail() for p in self.processes)


def alive(process: ManagedProcess, probe: Callable[[], Any]) -> Callable[[], Any]:
    """A readiness probe that fails at once if the process already exited."""
    def check() -> Any:
        assert process.running(), f"{process.name} exited with code {process.proc.returncode}"
        return probe()
    return check


def start_checker(tmp: Path, env: dict[str, str], bootstrap: str, port: int) -> ManagedProcess:
    command, checker_env = compose_settings("checker", {
        "TRAINWATCH_BOOTSTRAP": bootstrap,
        "TRAINWATCH_METRICS_HOST": "127.0.0.1",
        "TRAINWATCH_METRICS_PORT": str(port),
        "TRAINWATCH_PARTITIONS": str(PARTITIONS),
        "TRAINWATCH_GRACE_SECONDS": "1",
    })
    return ManagedProcess("checker", [sys.executable, "-c", BLOCK_TORCH, *command],
                          tmp / "checker.log", env={**env, **checker_env}, cwd=tmp).start()


def training_run(tmp: Path, env: dict[str, str], bootstrap: str) -> ManagedProcess:
    """2-rank DDP on gloo where rank 1 silently nudges a weight after step 2."""
    return ManagedProcess("training", [
        sys.executable, "-m", "trainwatch.cli", "collect", "--bootstrap", bootstrap, "--run-id", TRAINING_RUN, "--",
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        str(ROOT / "examples" / "ddp_gloo.py"), "--steps", "6", "--perturb-rank", "1", "--perturb-step", "2",
    ], tmp / "training.log", env=env, cwd=tmp)


def start_alertmanager(binary: str, tmp: Path, webhook_url: str, port: int) -> ManagedProcess:
    config = tmp / "alertmanager.yml"
    config.write_text(yaml.safe_dump(alertmanager_config(webhook_url)))
    return ManagedProcess("alertmanager", [
        binary, f"--config.file={config}", f"--storage.path={tmp / 'am-data'}",
        f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
    ], tmp / "alertmanager.log").start()


def start_prometheus(binary: str, tmp: Path, env: dict[str, str], checker_port: int,
                     alertmanager_port: int, port: int) -> ManagedProcess:
    rules_with_short_for(tmp / "rules")
    config = tmp / "prometheus.yml"
    config.write_text(yaml.safe_dump(prometheus_config(tmp / "rules", checker_port, alertmanager_port, port)))
    feature_flags, prometheus_env = prometheus_settings()
    return ManagedProcess("prometheus", [
        binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'prom-data'}",
        f"--web.listen-address=127.0.0.1:{port}", *feature_flags,
    ], tmp / "prometheus.log", env={**env, **prometheus_env}).start()


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
        # panels for the buggy training run, the drop/late/missing-rank/trend panels
        # for the faulty pipeline run.
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
