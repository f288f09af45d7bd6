"""``trainwatch watch``: broker, checker and training command on one machine.

The pieces are real processes: an embedded tansu broker (unless ``--bootstrap``
names a cluster), a ``trainwatch serve`` child, and the training command under
``trainwatch collect``.  This process only orchestrates: it follows the violations
topic and prints this run's violations as they arrive, waits (bounded) for the
checker to drain the run once the command has exited, and tears everything down in
reverse order — whatever happened.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from invariants.coverage_text import describe_totals, nothing_checked_line, training_iterations
from invariants.events import DEFAULT_TOPIC_PREFIX

from ..config import DEFAULT_GRACE_SECONDS, TopicNames
from ..coverage_metrics import totals_from_samples
from .violation_follower import ViolationFollower
from .supervisor import CheckerProcess, metric

EXIT_OK, EXIT_VIOLATIONS, EXIT_USAGE = 0, 1, 2
#: where the `collect` it runs reports batches sent and dropped (trainwatch.commands.collect)
ENV_DELIVERY_REPORT = "TRAINWATCH_DELIVERY_REPORT"
#: A checker that has consumed nothing of the run this long after the command exited
#: will not: the producers flush before the command's processes exit.
NOTHING_SENT_AFTER_S = 5.0


@dataclass
class WatchOptions:
    command: list[str]
    run_id: str
    bootstrap: str | None = None
    invariants: str | None = None
    metrics_port: int = 0
    trace_dir: str | None = None
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    partitions: int = 4
    topic_prefix: str = DEFAULT_TOPIC_PREFIX
    drain_timeout_s: float = 60.0
    extra_collect_args: list[str] = field(default_factory=list)
    #: print only the first violation of each invariant and sparse reminders
    fold_repeats: bool = True


class WatchSession:
    def __init__(self, options: WatchOptions, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.options = options
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.workdir = Path(tempfile.mkdtemp(prefix="trainwatch-watch-"))
        self.broker: Any = None
        self.checker: CheckerProcess | None = None
        self.follower: ViolationFollower | None = None

    def say(self, text: str) -> None:
        print(f"trainwatch watch: {text}", file=self.err, flush=True)

    # ------------------------------------------------------------------ setup
    def _start_broker(self) -> str:
        if self.options.bootstrap:
            return self.options.bootstrap
        from ..embedded_broker import EmbeddedBroker

        self.broker = EmbeddedBroker(log_path=self.workdir / "broker.log").start()
        return self.broker.bootstrap

    def _start_checker(self, bootstrap: str) -> CheckerProcess:
        o = self.options
        args = ["--partitions", str(o.partitions), "--grace-seconds", str(o.grace_seconds),
                "--topic-prefix", o.topic_prefix, "--app-id", f"trainwatch-watch-{o.run_id}",
                "--data-dir", str(self.workdir / "checker")]
        if o.invariants:
            args += ["-i", o.invariants]
        checker = CheckerProcess(bootstrap, self.workdir / "checker.log", args, metrics_port=o.metrics_port)
        self.checker = checker
        return checker.start()

    # ------------------------------------------------------------------ run
    def run(self) -> int:
        o = self.options
        training_rc: int | None = None
        interrupted = False
        code = EXIT_USAGE
        try:
            try:
                bootstrap = self._start_broker()
            except Exception as exc:
                self.say(str(exc))
                return EXIT_USAGE
            try:
                checker = self._start_checker(bootstrap)
            except Exception as exc:
                self.say(f"the checker did not start: {exc}")
                return EXIT_USAGE
            self._header(bootstrap, checker)
            self.follower = ViolationFollower(bootstrap, TopicNames(o.topic_prefix).violations, o.run_id, self.out,
                                             fold_repeats=o.fold_repeats)
            self.follower.start()
            try:
                training_rc = self._run_training(bootstrap)
            except KeyboardInterrupt:
                interrupted = True
                self.say("interrupted; stopping")
            incomplete = None
            if not interrupted:
                if not self._drain(checker):
                    incomplete = (f"the checker did not finish this run within {o.drain_timeout_s:g}s "
                                  "(is the broker down?)")
                incomplete = self._undelivered() or incomplete
                if incomplete:
                    self.say(incomplete + "; the results below cover only what arrived")
            code = self._summary(training_rc, interrupted, incomplete is not None)
            return code
        finally:
            self._teardown()
            if code in (EXIT_OK, EXIT_VIOLATIONS):
                shutil.rmtree(self.workdir, ignore_errors=True)
            else:
                self.say(f"logs kept in {self.workdir}")

    def _header(self, bootstrap: str, checker: CheckerProcess) -> None:
        where = "embedded tansu broker" if self.broker is not None else "Kafka cluster"
        lines = [
            f"run      {self.options.run_id}",
            f"broker   {bootstrap} ({where})",
            f"metrics  {checker.metrics_url}",
            f"checker  pid {checker.proc.pid if checker.proc else '?'}, log {checker.log_path}",
        ]
        if self.options.trace_dir:
            lines.append(f"traces   {self.options.trace_dir}")
        self.say("checking live\n  " + "\n  ".join(lines))

    def _run_training(self, bootstrap: str) -> int:
        o = self.options
        argv = [sys.executable, "-m", "trainwatch.cli", "collect", "--bootstrap", bootstrap, "--run-id", o.run_id,
                "--topic-prefix", o.topic_prefix, *o.extra_collect_args]
        if o.trace_dir:
            argv += ["-o", o.trace_dir]
        if o.invariants:
            argv += ["-i", o.invariants]
        argv += ["--", *o.command]
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        env[ENV_DELIVERY_REPORT] = str(self.delivery_path)
        # Own process group: on Ctrl-C/SIGTERM the whole training tree is signalled at once.
        proc = subprocess.Popen(argv, env=env, start_new_session=True)
        try:
            return proc.wait()
        except KeyboardInterrupt:
            self._signal_group(proc, signal.SIGINT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._signal_group(proc, signal.SIGKILL)
                proc.wait()
            raise

    @staticmethod
    def _signal_group(proc: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    def _drain(self, checker: CheckerProcess) -> bool:
        """Wait until the checker has consumed everything and closed this run's windows."""
        run = self.options.run_id
        started = time.monotonic()
        deadline = started + self.options.drain_timeout_s
        stable_since: float | None = None
        last_checked = -1.0
        while time.monotonic() < deadline:
            if not checker.running:
                self.say("the checker exited early; see its log: " + str(checker.log_path))
                return False
            try:
                samples = checker.metrics()
            except OSError:
                time.sleep(0.2)
                continue
            lag = sum(v for k, v in samples.items() if k.startswith("trainwatch_consumer_lag_messages"))
            lag_known = any(k.startswith("trainwatch_consumer_lag_messages") for k in samples)
            consumed = metric(samples, "trainwatch_batches_consumed_total", run=run)
            open_windows = metric(samples, "trainwatch_open_windows")
            checked = metric(samples, "trainwatch_steps_checked_total", run=run)
            idle = lag_known and lag == 0 and open_windows == 0 and consumed > 0
            if consumed == 0 and open_windows == 0 and time.monotonic() - started > NOTHING_SENT_AFTER_S:
                break  # the command never streamed a batch for this run (e.g. it never imported torch)
            if idle and checked == last_checked:
                stable_since = stable_since or time.monotonic()
                if time.monotonic() - stable_since >= 0.5:
                    break
            else:
                stable_since = None
            last_checked = checked
            time.sleep(0.2)
        else:
            return False
        if self.follower is not None:
            self.follower.settle(max(1.0, deadline - time.monotonic()))
        return True

    @property
    def delivery_path(self) -> Path:
        return Path(self.workdir) / "delivery.json"

    def _undelivered(self) -> str | None:
        """What the training processes could not hand to the broker (it died, or was never
        reachable): one line, or None when everything was sent."""
        try:
            report = json.loads(self.delivery_path.read_text())
            dropped, batches = int(report["dropped_batches"]), int(report["batches"])
        except (OSError, ValueError, KeyError, TypeError):
            return "the training processes did not report what they delivered"
        if dropped:
            return f"{dropped} of {batches} batches never reached the broker"
        return None

    def _summary(self, training_rc: int | None, interrupted: bool, incomplete: bool = False) -> int:
        violations = list(self.follower.seen.values()) if self.follower else []
        samples: dict[str, float] = {}
        if self.checker is not None and self.checker.running:
            try:
                samples = self.checker.metrics()
            except OSError:
                pass
        # without the counters nothing says what was checked: never "no violation" then
        coverage = totals_from_samples(samples, self.options.run_id, metric) if samples else None
        if self.follower is not None and self.follower.folder.tallies:
            print("violations by invariant:", file=self.out)
            for line in self.follower.folder.rollup():
                print(line, file=self.out)
            folded = self.follower.folder.folded()
            if folded:
                print(f"  ({folded} repeat(s) not printed above; --every-violation prints each one)", file=self.out)
            self.out.flush()
        invariant_violations = [v for v in violations if not str(v.get("relation", "")).startswith("Trend:")]
        trend_alerts = len(violations) - len(invariant_violations)
        checked = (f"{training_iterations(coverage.iterations)} ({describe_totals(coverage)})" if coverage
                   else "an unknown number of training iterations (the checker's metrics could not be read)")
        untrained = not invariant_violations and (coverage is None or not coverage.iterations)
        if untrained and coverage is None:
            parts = [f"run {self.options.run_id}: coverage unknown: the checker's metrics could not be read"]
        elif untrained:  # nothing a rule could judge was checked: not "no violation"
            parts = [nothing_checked_line(self.options.run_id, coverage.optimizer_steps,
                                          coverage.setup_windows > 0)]
        elif violations:
            first = min(violations, key=lambda v: (v.get("step") or 0))
            kinds = len({v.get("invariant") for v in invariant_violations})
            parts = [f"run {self.options.run_id}: {len(invariant_violations)} violation(s) of {kinds} invariant(s)"]
            if trend_alerts:
                parts.append(f"{trend_alerts} trend alert(s)")
            parts.append(f"first at step {first.get('step')} [{first.get('relation')}]")
            parts.append(f"in {checked}")
        else:
            parts = [f"run {self.options.run_id}: no violation in {checked}"]
        if training_rc is not None:
            parts.append("training exited 0" if training_rc == 0 else f"training FAILED with exit code {training_rc}")
        self.say("; ".join(parts))
        if self.follower is not None and self.follower.error:
            self.say(f"could not follow the violations topic: {self.follower.error}")
            return EXIT_USAGE
        failing = invariant_violations + [
            v for v in violations if str(v.get("relation", "")).startswith("Trend:nonfinite")
        ]
        if failing:  # NaN/Inf counts; other trend alerts (spikes, plateaus) only inform
            return EXIT_VIOLATIONS
        if interrupted:
            return 130
        if training_rc not in (0, None) or untrained or incomplete:
            return EXIT_USAGE  # infrastructure kept part of the run from being checked
        return EXIT_OK

    def _teardown(self) -> None:
        if self.follower is not None:
            self.follower.stop()
        if self.checker is not None:
            self.checker.stop()
        if self.broker is not None:
            self.broker.stop()
