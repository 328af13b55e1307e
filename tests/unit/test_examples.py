"""examples/pgbouncer.ini and examples/userlist.txt: a configuration `pgtarn check` passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgtarn.auth.userlist import load_userlist
from pgtarn.cli.check import check_config
from pgtarn.config.inifile import load_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_example_passes_pgtarn_check_without_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(EXAMPLES)  # its auth_file is relative, as the comment in it says
    result = check_config("pgbouncer.ini")
    assert (result.errors, result.warnings) == ([], [])


def test_the_example_pools_transactions_and_lets_its_user_in_and_to_the_console(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(EXAMPLES)
    config = load_config("pgbouncer.ini")
    assert config.pool_mode == "transaction" and list(config.databases) == ["app"]
    users = load_userlist(config.auth_file)
    assert list(users) == ["app"] and "app" in config.admin_users
