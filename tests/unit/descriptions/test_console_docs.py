"""The admin console's descriptions match its tables, commands and permissions."""

from __future__ import annotations

import pytest

from pgtarn.admin.commands import COMMANDS
from pgtarn.admin.console import AdminSession
from pgtarn.admin.result import AdminError
from pgtarn.admin.show import SHOW_TABLES
from pgtarn.config.settings import Config
from pgtarn.descriptions import console as described
from pgtarn.runtime import Runtime

from ..admin.test_console import FakeClient


def _columns(show: str) -> list[str]:
    return [name for name, _ in SHOW_TABLES[show](Runtime(Config.default(), {})).columns]


@pytest.mark.parametrize("show", sorted(SHOW_TABLES))
def test_every_show_and_column_has_a_description(show: str) -> None:
    assert show in described.SHOWS, f"SHOW {show}: add a ShowDoc"
    meanings = described.COLUMNS.get(show, {})
    missing = [c for c in _columns(show) if not meanings.get(c, "").strip()]
    assert missing == [], f"SHOW {show}: columns without a description"
    assert sorted(set(meanings) - set(_columns(show))) == [], f"SHOW {show}: stale columns"
    assert set(described.SHOWS[show].extra) <= set(_columns(show))


def test_no_description_of_a_show_that_does_not_exist() -> None:
    assert sorted(set(described.SHOWS) - set(SHOW_TABLES)) == []
    assert sorted(set(described.COLUMNS) - set(SHOW_TABLES)) == []
    # one that pgtarn now has must leave the list of missing ones
    assert sorted(set(described.MISSING_SHOWS) & set(SHOW_TABLES)) == []


def test_every_command_is_described() -> None:
    assert set(described.COMMANDS) == {*COMMANDS, "set"}


def _refused(query: str) -> bool:
    """Whether a stats_users session is refused the query with 42501."""
    session = AdminSession(FakeClient(), Runtime(Config.default(), {}), admin=False)
    try:
        session.run(query)
    except AdminError as error:
        return error.sqlstate == "42501"
    return False


@pytest.mark.parametrize("show", sorted(SHOW_TABLES))
def test_who_may_run_each_show_is_what_the_console_enforces(show: str) -> None:
    assert _refused(f"SHOW {show}") == (show in described.ADMIN_ONLY_SHOWS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_commands_are_for_admin_users_only(command: str) -> None:
    assert _refused(command.upper())


def test_set_is_for_admin_users_only() -> None:
    assert _refused("SET default_pool_size = 3")
