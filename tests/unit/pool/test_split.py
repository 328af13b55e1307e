"""read_write_split in the registry: a home pool that follows the primary, replicas' pools
made on first read, reads by fewest outstanding transactions, and a client's route."""

from __future__ import annotations

from typing import Any

import pytest

from pgtarn.config.inifile import parse_config
from pgtarn.config.settings import DatabaseEntry
from pgtarn.errors import PgtarnError
from pgtarn.pool.hosts import HostSet
from pgtarn.pool.pool import Pool, PooledServer
from pgtarn.pool.pool import Waiter as PoolWaiter
from pgtarn.pool.registry import Registry
from pgtarn.pool.split import ClientRoute, Split
from pgtarn.session.effects import Kind

INI = """
[databases]
app = host=10.0.0.1,10.0.0.2,10.0.0.3 port=5432,5433,5434 dbname=app read_write_split=auto
plain = host=10.0.0.1 dbname=app
[pgbouncer]
pool_mode = transaction
default_pool_size = 2
"""


class FakeServer(PooledServer):
    def __init__(self, pool: Pool[Any], db: DatabaseEntry) -> None:
        self.pool = pool
        self.db = db
        self.connstr = pool.connstr
        self.created_at = self.last_used = 0.0
        self.close_needed = False
        self.closed = ""

    def close(self, reason: str, wait: bool = False) -> None:
        self.closed = reason

    def start_check(self) -> None:
        pass


class Waiter(PoolWaiter[FakeServer]):
    def __init__(self) -> None:
        self.servers: list[FakeServer] = []

    def server_assigned(self, server: FakeServer) -> None:
        self.servers.append(server)

    def server_unavailable(self, error: object) -> None:
        pass

    def waiting_too_long(self) -> None:
        pass


class Checker:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def registry() -> Registry[FakeServer]:
    registry: Registry[FakeServer] = Registry(parse_config(INI))
    registry.launch = lambda pool, db: FakeServer(pool, db)
    registry.start_health = lambda hosts, pool, db: Checker()
    return registry


def _split(registry: Registry[FakeServer], user: str = "u") -> Split[Pool[FakeServer]]:
    pool = registry.get_pool(registry.config.databases["app"], user)
    assert pool.split is not None
    return pool.split


def _up(hosts: HostSet, primary: int = 0) -> None:
    for host in hosts.hosts:
        hosts.check_passed(host.index, host.index != primary, 100, 0.0, hosts.clock())


def test_only_split_entries_get_a_split_and_users_share_one_host_set(
    registry: Registry[FakeServer],
) -> None:
    assert registry.get_pool(registry.config.databases["plain"], "u").split is None
    one, two = _split(registry, "u"), _split(registry, "v")
    assert one.hosts is two.hosts and len(registry.checkers) == 1
    assert [h.key for h in one.hosts.hosts] == ["10.0.0.1:5432", "10.0.0.2:5433", "10.0.0.3:5434"]


def test_the_home_pool_connects_to_the_primary_the_checks_found(
    registry: Registry[FakeServer],
) -> None:
    split = _split(registry)
    home = split.home
    assert home.launch is not None
    unknown = home.launch(home)  # none known yet: any host that takes writes
    home.login.add(unknown)
    assert unknown.db.hosts and unknown.db.target_session_attrs == "read-write"
    _up(split.hosts, primary=1)
    server = home.launch(home)
    assert (server.db.host, server.db.port, server.db.hosts) == ("10.0.0.2", 5433, ())
    home.idle.append(server)
    _up(split.hosts, primary=2)  # a failover: its servers go, new ones open on the new one
    assert server.closed == "the primary changed" and not home.idle
    assert unknown.close_needed


def test_reads_go_to_the_least_busy_replica_and_writes_home(registry: Registry[FakeServer]) -> None:
    split = _split(registry)
    split.primary_reads = False
    assert split.read_pool(0.0) is split.home  # no replica known yet
    _up(split.hosts, primary=0)
    first = split.read_pool(0.0)
    second = split.read_pool(0.0)
    assert {first.host_index, second.host_index} == {1, 2}  # equal loads take turns
    first.active.add(FakeServer(first, registry.config.databases["app"]))
    assert all(split.read_pool(0.0) is second for _ in range(4))
    assert second.launch is not None
    replica = second.launch(second)
    host = split.hosts.hosts[second.host_index]
    assert (replica.db.host, replica.db.port, replica.db.hosts) == (host.host, host.port, ())
    assert split.write_pool() is split.home
    assert split.hosts.hosts[0].routed == 1 and host.routed == 5
    assert set(registry) >= {first, second, split.home}


def test_a_replica_that_goes_down_hands_its_waiting_readers_to_the_primary(
    registry: Registry[FakeServer],
) -> None:
    split = _split(registry)
    split.primary_reads = False
    _up(split.hosts, primary=0)
    replica = split.read_pool(0.0)
    reader = Waiter()
    assert replica.acquire(reader) is None and list(replica.waiting) == [reader]
    split.hosts.check_failed(replica.host_index, "connection refused")
    assert not replica.waiting and list(split.home.waiting) == [reader]
    assert split.read_pool(0.0).host_index not in (-1, replica.host_index)


def test_a_replica_login_failure_bans_its_host(registry: Registry[FakeServer]) -> None:
    split = _split(registry)
    _up(split.hosts, primary=0)
    woken: list[bool] = []
    split.hosts.wake = lambda: woken.append(True)
    split.primary_reads = False
    replica = split.read_pool(0.0)
    server = FakeServer(replica, registry.config.databases["app"])
    replica.login.add(server)
    replica.server_login_failed(server, PgtarnError("refused", sqlstate="08006"), retry=True)
    host = split.hosts.hosts[replica.host_index]
    assert not host.up and host.reason == "login failed: refused" and woken


def test_a_client_route_sends_reads_by_kind_and_remembers_writes(
    registry: Registry[FakeServer],
) -> None:
    split = _split(registry)
    split.primary_reads = False
    _up(split.hosts, primary=0)
    route = ClientRoute(split, reads_only=False)
    route.kind = Kind.READ
    assert route.pool_for(False).host_index >= 0
    route.kind = Kind.OTHER
    assert route.pool_for(False) is split.home and route.writing
    route.ended()
    assert route.wrote_at > 0 and not route.writing
    route.kind = Kind.READ  # right after its write: no sample since, so the primary
    assert route.pool_for(False) is split.home and split.hosts.sample_wanted
    split.mode = "explicit"
    route.wrote_at = 0.0
    route.kind = Kind.READ  # explicit: a plain SELECT is not a read-only transaction
    assert route.pool_for(False) is split.home
    route.kind = Kind.BEGIN_READ_ONLY
    assert route.pool_for(False).host_index >= 0
    assert route.pool_for(True).host_index >= 0  # default_transaction_read_only
    route.begin = "BEGIN"  # a BEGIN answered here: the statement after it decides
    route.kind = Kind.SET_READ_ONLY
    assert route.pool_for(False).host_index >= 0
    route.kind = Kind.READ
    assert route.pool_for(False) is split.home
    assert ClientRoute(split, reads_only=True).pool_for(False).host_index >= 0


def test_reload_turning_the_split_off_closes_the_replicas_and_the_checker(
    registry: Registry[FakeServer],
) -> None:
    split = _split(registry)
    _up(split.hosts, primary=0)
    split.primary_reads = False
    replica = split.read_pool(0.0)
    idle = FakeServer(replica, registry.config.databases["app"])
    replica.idle.append(idle)
    checker = registry.checkers[next(iter(registry.checkers))]
    registry.apply(parse_config(INI.replace(" read_write_split=auto", "")))
    assert split.home.split is None and idle.closed and replica not in set(registry)
    assert isinstance(checker, Checker) and checker.closed and not registry.hostsets
