"""Fixtures that more than one integration test module uses (pytest finds them here,
so the modules need not import them)."""

from __future__ import annotations

import pytest

from tests.support.deploy_files import REQUIRED_SETTINGS, compose_config


@pytest.fixture(scope="module")
def default_services(tmp_path_factory) -> dict:
    """The compose services with only the required setting: every other variable at its default."""
    tmp = tmp_path_factory.mktemp("compose-defaults")
    minimal = tmp / "minimal.env"
    minimal.write_text(REQUIRED_SETTINGS)
    return compose_config(minimal, tmp)["services"]
