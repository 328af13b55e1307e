"""target_session_attrs on a [databases] host list, against a real primary and its streaming
standby: servers open only on the hosts whose role fits, as libpq picks them."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.support import PgtarnProcess
from tests.support.cluster import PrimaryCluster, StandbyCluster, primary_and_standby

from .conftest import PgtarnFactory
from .drivers import connect, scalar

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[PrimaryCluster, StandbyCluster]]:
    with primary_and_standby() as clusters:
        yield clusters


def _entry(
    primary: PrimaryCluster, standby: StandbyCluster, attrs: str, standby_first: bool = True
) -> str:
    hosts = [standby, primary] if standby_first else [primary, standby]
    return (
        f"host={','.join(c.host for c in hosts)} "
        f"port={','.join(str(c.port) for c in hosts)} dbname=app "
        f"target_session_attrs={attrs}"
    )


def _roles(proc: PgtarnProcess, dbname: str, clients: int = 6) -> set[bool]:
    """pg_is_in_recovery() as seen by clients each holding a server of their own."""
    held = [connect(proc, dbname=dbname) for _ in range(clients)]  # a transaction each
    try:
        return {scalar(c.execute("select pg_is_in_recovery()")) for c in held}
    finally:
        for c in held:
            c.close()


@pytest.mark.parametrize(
    ("attrs", "in_recovery"),
    [
        ("read-write", {False}),
        ("primary", {False}),
        ("read-only", {True}),
        ("standby", {True}),
        ("prefer-standby", {True}),
    ],
)
def test_servers_open_only_where_the_role_fits(
    pgtarn_factory: PgtarnFactory,
    pair: tuple[PrimaryCluster, StandbyCluster],
    attrs: str,
    in_recovery: set[bool],
) -> None:
    primary, standby = pair
    proc = pgtarn_factory(
        databases={
            "app": _entry(primary, standby, attrs, standby_first=attrs in ("read-write", "primary"))
        },
        settings={"default_pool_size": 8},
    )
    assert {bool(r) for r in _roles(proc, "app")} == in_recovery


def test_prefer_standby_takes_the_primary_when_no_standby_fits(
    pgtarn_factory: PgtarnFactory, pair: tuple[PrimaryCluster, StandbyCluster]
) -> None:
    primary, _standby = pair
    entry = (
        f"host={primary.host} port={primary.port} dbname=app target_session_attrs=prefer-standby"
    )
    proc = pgtarn_factory(databases={"app": entry})
    assert _roles(proc, "app", 2) == {False}


def test_no_fitting_host_fails_the_login_and_says_why(
    pgtarn_factory: PgtarnFactory, pair: tuple[PrimaryCluster, StandbyCluster]
) -> None:
    # transient, as a failover may bring a fitting server: clients wait query_wait_timeout
    _primary, standby = pair
    entry = f"host={standby.host} port={standby.port} dbname=app target_session_attrs=read-write"
    proc = pgtarn_factory(databases={"app": entry}, settings={"query_wait_timeout": 2})
    with pytest.raises(psycopg.OperationalError):
        with connect(proc, connect_timeout=15) as c:
            c.execute("select 1")
    assert "no server of the host list fits target_session_attrs=read-write" in proc.log_text()
