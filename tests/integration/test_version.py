"""pyproject.toml is the only place the version is written; everything reports that one."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as distribution_version
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

import trainwatch
import trainwatch_version
from stream_checkers.metrics import CheckerMetrics
from trainwatch.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def _pyproject_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_installed_metadata_is_pyproject_version():
    # a stale install (pyproject bumped, package not reinstalled) fails here, not in a report
    assert distribution_version("trainwatch") == _pyproject_version()


def test_package_version_is_pyproject_version():
    assert trainwatch.__version__ == _pyproject_version()


def test_cli_prints_pyproject_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"trainwatch {_pyproject_version()}"


def test_installed_command_prints_pyproject_version():
    out = subprocess.run([sys.executable, "-m", "trainwatch.cli", "--version"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"trainwatch {_pyproject_version()}"


def test_checker_build_info_carries_pyproject_version():
    registry = CollectorRegistry()
    CheckerMetrics(registry)
    assert registry.get_sample_value("trainwatch_build_info", {"version": _pyproject_version()}) == 1


def test_sources_without_metadata_say_unknown(monkeypatch):
    def missing(name: str) -> str:
        raise PackageNotFoundError(name)

    monkeypatch.setattr(trainwatch_version, "distribution_version", missing)
    trainwatch_version.version.cache_clear()
    try:
        assert trainwatch_version.version() == trainwatch_version.UNKNOWN
    finally:
        trainwatch_version.version.cache_clear()
