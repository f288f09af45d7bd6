"""Fixtures that more than one integration test module uses (pytest finds them here,
so the modules need not import them)."""

from __future__ import annotations

import pytest

from invariants.invariant_file import dumps, load_default_set
from tests.support.deploy_files import REQUIRED_SETTINGS, compose_config
from tests.support.kafka import CheckerProcess
from tests.support.stream_runs import FAST


@pytest.fixture(scope="module")
def default_services(tmp_path_factory) -> dict:
    """The compose services with only the required setting: every other variable at its default."""
    tmp = tmp_path_factory.mktemp("compose-defaults")
    minimal = tmp / "minimal.env"
    minimal.write_text(REQUIRED_SETTINGS)
    return compose_config(minimal, tmp)["services"]


@pytest.fixture(scope="module")
def pinned_invariants(tmp_path_factory) -> str:
    """The shipped cross-rank Consistent invariants, pinned for the streaming checker tests.

    The shipped set is regenerated as reference pipelines change; those tests are
    about the streaming machinery, so they fix the rules the synthetic runs exercise.
    """
    chosen = [inv for inv in load_default_set().invariants if inv.relation == "Consistent"]
    assert any(inv.params.get("attr") == "data_digest" for inv in chosen)
    path = tmp_path_factory.mktemp("invariants") / "consistent.json"
    path.write_text(dumps(chosen))
    return str(path)


@pytest.fixture
def checker(kafka_broker, tmp_path, pinned_invariants):
    started: list[CheckerProcess] = []

    def start(name: str = "w1", extra: list[str] | None = None) -> CheckerProcess:
        proc = CheckerProcess(kafka_broker.bootstrap, tmp_path / f"{name}.log",
                              [*FAST, "-i", pinned_invariants, "--data-dir", str(tmp_path / name),
                               *(extra or [])])
        started.append(proc.start())
        return proc

    yield start
    for proc in started:
        proc.stop()
