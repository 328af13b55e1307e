"""The health checker against a real primary and its streaming standby: roles, LSNs and lag as
the servers report them, bans while a host is down, a promotion seen without a reload, and
two primaries at once (split brain)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from pgtarn.config.inifile import parse_config
from pgtarn.pool.hosts import PRIMARY, REPLICA, HostSet
from pgtarn.runtime import Runtime
from pgtarn.server.health import APPLICATION_NAME, HealthChecker, start_health
from tests.support.cluster import PrimaryCluster, StandbyCluster, primary_and_standby

pytestmark = pytest.mark.integration

PERIOD = 0.2
T = TypeVar("T")

INI = """
[databases]
app = host={hosts} port={ports} dbname=app user=app password=app_pass
[pgbouncer]
auth_type = trust
log_connections = 0
log_disconnections = 0
"""


_SETUP = ("CREATE TABLE marks (n int); GRANT ALL ON marks TO app;", "app")


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[PrimaryCluster, StandbyCluster]]:
    with primary_and_standby(_SETUP) as clusters:
        yield clusters


@pytest.fixture
def doomed_pair() -> Iterator[tuple[PrimaryCluster, StandbyCluster]]:
    """A pair of its own, for the tests that promote the standby."""
    with primary_and_standby(_SETUP) as clusters:
        yield clusters


class Checking:
    """A HealthChecker of the pair (primary first), run by an event loop in a thread; the
    test reads the HostSet inside that loop."""

    def __init__(
        self, primary: PrimaryCluster, standby: StandbyCluster, period: float = PERIOD
    ) -> None:
        clusters = (primary, standby)
        self.config = parse_config(
            INI.format(
                hosts=",".join(c.host for c in clusters),
                ports=",".join(str(c.port) for c in clusters),
            )
        )
        self.hosts = HostSet("app", [(c.host, c.port) for c in clusters], period=period)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.checker: HealthChecker = self.call(self._start)

    def _start(self) -> HealthChecker:
        runtime = Runtime(self.config, {})
        db = self.config.databases["app"]
        return start_health(runtime, self.hosts, runtime.registry.get_pool(db, "app"), db)

    def call(self, function: Callable[[], T]) -> T:
        async def run() -> T:
            return function()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def until(self, check: Callable[[HostSet], Any], seconds: float = 10.0) -> Any:
        """Wait until check(hosts) is true (run in the loop); return its value."""
        deadline = self.loop.time() + seconds
        while True:
            value = self.call(lambda: check(self.hosts))
            if value:
                return value
            if self.loop.time() > deadline:
                raise AssertionError(f"not so after {seconds} s: {self.describe()}")
            threading.Event().wait(0.05)

    def describe(self) -> str:
        def text(hosts: HostSet) -> str:
            return (
                "; ".join(
                    f"{h.key} {h.role} up={h.up} lsn={h.lsn} lag={h.lag_bytes}B/{h.lag_seconds}s "
                    f"banned_until={h.banned_until} reason={h.reason!r}"
                    for h in hosts.hosts
                )
                + f"; primary={hosts.primary} split_brain={hosts.split_brain}"
            )

        return self.call(lambda: text(self.hosts))

    def close(self) -> None:
        self.call(self.checker.close)
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0.05), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def checking(pair: tuple[PrimaryCluster, StandbyCluster]) -> Iterator[Checking]:
    running = Checking(*pair)
    try:
        yield running
    finally:
        running.close()


def _settled(hosts: HostSet) -> bool:
    primary, standby = hosts.hosts
    return (
        primary.up
        and primary.role == PRIMARY
        and standby.up
        and standby.role == REPLICA
        and hosts.primary is primary
    )


def _health_backends(primary: PrimaryCluster) -> str:
    return primary.psql(
        "SELECT count(*), min(backend_start) FROM pg_stat_activity "
        f"WHERE application_name = '{APPLICATION_NAME}';"
    )


def test_the_primary_and_the_replica_are_told_apart_with_their_lsns(
    checking: Checking, pair: tuple[PrimaryCluster, StandbyCluster]
) -> None:
    checking.until(_settled)
    primary, standby = checking.hosts.hosts
    assert primary.lsn > 0 and standby.lsn > 0 and not checking.hosts.split_brain
    # one kept connection per host, reused check after check
    first = _health_backends(pair[0])
    assert first.startswith("1|")
    checked = checking.call(lambda: primary.checked_at)
    checking.until(lambda hosts: hosts.hosts[0].checked_at > checked + 3 * PERIOD)
    assert _health_backends(pair[0]) == first


def test_a_paused_replay_shows_as_lag_and_goes_away_when_resumed(
    checking: Checking, pair: tuple[PrimaryCluster, StandbyCluster]
) -> None:
    primary, standby = pair
    checking.until(_settled)
    checking.until(lambda hosts: hosts.hosts[1].lag_bytes == 0 and hosts.hosts[1].lag_seconds == 0)
    standby.psql("SELECT pg_wal_replay_pause();")
    try:
        primary.psql("INSERT INTO marks SELECT generate_series(1, 1000);", dbname="app")
        first = checking.until(
            lambda hosts: (
                hosts.hosts[1].lag_bytes > 0
                and hosts.hosts[1].lag_seconds > 0
                and hosts.hosts[1].lag_seconds
            )
        )
        checking.until(lambda hosts: hosts.hosts[1].lag_seconds > first + 3 * PERIOD)
        assert checking.hosts.hosts[1].up  # lagging is not a failure
    finally:
        standby.psql("SELECT pg_wal_replay_resume();")
    checking.until(lambda hosts: hosts.hosts[1].lag_bytes == 0 and hosts.hosts[1].lag_seconds == 0)


def test_a_wake_checks_every_host_at_once(pair: tuple[PrimaryCluster, StandbyCluster]) -> None:
    running = Checking(*pair, period=60.0)
    try:
        running.until(_settled)
        before = running.call(lambda: [h.checked_at for h in running.hosts.hosts])
        running.call(running.hosts.wake)
        running.until(
            lambda hosts: all(h.checked_at > b for h, b in zip(hosts.hosts, before, strict=True)),
            seconds=2.0,
        )
    finally:
        running.close()


def test_a_stopped_standby_is_banned_and_back_once_started(
    checking: Checking, pair: tuple[PrimaryCluster, StandbyCluster]
) -> None:
    _primary, standby = pair
    checking.until(_settled)
    standby.stop()
    try:
        checking.until(
            lambda hosts: (
                not hosts.hosts[1].up and hosts.hosts[1].reason and hosts.hosts[1].banned_until
            )
        )
        assert checking.hosts.primary is checking.hosts.hosts[0]
    finally:
        standby.start()
    checking.until(_settled)
    assert checking.hosts.hosts[1].reason == "" and not checking.hosts.hosts[1].banned_until


def test_a_promoted_standby_becomes_the_primary_when_the_old_one_is_gone(
    doomed_pair: tuple[PrimaryCluster, StandbyCluster],
) -> None:
    primary_cluster, standby_cluster = doomed_pair
    running = Checking(*doomed_pair)
    try:
        running.until(_settled)
        primary_cluster.stop()
        running.until(lambda hosts: not hosts.hosts[0].up and hosts.primary is None)
        standby_cluster.promote()
        running.until(lambda hosts: hosts.primary is hosts.hosts[1])
        assert running.hosts.hosts[1].role == PRIMARY and not running.hosts.split_brain
    finally:
        running.close()


def test_two_primaries_are_split_brain(doomed_pair: tuple[PrimaryCluster, StandbyCluster]) -> None:
    _primary_cluster, standby_cluster = doomed_pair
    running = Checking(*doomed_pair)
    try:
        running.until(_settled)
        standby_cluster.promote()
        running.until(lambda hosts: hosts.split_brain)
        assert running.hosts.primary is None
        assert all(h.role == PRIMARY and h.up for h in running.hosts.hosts)
    finally:
        running.close()
