"""The read/write split in the SHOW tables: SHOW HOSTS, SHOW SERVERS' role and lag, a replica's
pool folded into its home pool's SHOW POOLS row, and the SHOW HOSTS rule of workers = N."""

from __future__ import annotations

import time
from typing import Any

import pytest

from pgtarn.admin.console import HELP
from pgtarn.admin.merge import merge
from pgtarn.admin.show import SHOW_TABLES
from pgtarn.admin.split import lsn_text
from pgtarn.admin.tables import (
    INT4,
    INT8,
    NUMERIC,
    SOCKET_COLUMNS,
    TEXT,
    Table,
    show_hosts,
    show_pools,
    show_servers,
    show_sockets,
)
from pgtarn.config.settings import Config, DatabaseEntry
from pgtarn.pool.hosts import HostSet
from pgtarn.pool.pool import Pool, PooledServer
from pgtarn.pool.pool import Waiter as PoolWaiter
from pgtarn.runtime import Runtime

SPLIT = DatabaseEntry(
    name="app",
    host="a",
    hosts=("a", "b", "c"),
    port=5432,
    ports=(5432, 5433, 5434),
    read_write_split="explicit",
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeServer(PooledServer):
    """What SHOW SERVERS reads of a server connection."""

    _ids = iter(range(1, 1_000_000))

    def __init__(self, pool: Pool[Any], target: tuple[str, int] = ("", 0)) -> None:
        self.id = next(self._ids)
        self.pool = pool
        self.connstr = pool.connstr
        self.created_at = self.last_used = time.monotonic()
        self.connect_time = time.time()
        self.close_needed = False
        self.client: object | None = None
        self.replication = ""
        self.peer = f"{target[0]}:{target[1]}"
        self.local_addr = "127.0.0.1:40000"
        self.backend_key = (1, 2)
        self.params: dict[str, str] = {}
        self.statements = None
        self.transport = None
        self.target = target

    def close(self, reason: str, wait: bool = False) -> None:
        pass

    def start_check(self) -> None:
        pass


class Waiter(PoolWaiter[FakeServer]):
    pass


def split_runtime(clock: Clock) -> tuple[Runtime, Any, HostSet]:
    """A split database: a is the primary, b a replica 300 bytes and 1.5 s behind, c banned."""
    runtime = Runtime(Config.default(), {})
    home = runtime.registry.get_pool(SPLIT, "u")
    assert home.split is not None
    hosts = home.split.hosts
    hosts.clock = clock
    hosts.check_passed(0, False, 0x1_0000_0500, 0.0, clock.now)
    hosts.check_passed(1, True, 0x1_0000_0200, 1.5, clock.now)
    hosts.check_failed(2, "connection refused")
    return runtime, home, hosts


def by_name(table: Table) -> list[dict[str, Any]]:
    names = [c for c, _ in table.columns]
    return [dict(zip(names, row, strict=True)) for row in table.rows]


# --- SHOW HOSTS ----------------------------------------------------------------------------------


def test_lsn_is_printed_as_postgresql_does() -> None:
    assert lsn_text(0) == "0/0"
    assert lsn_text(0x16_B374_D848) == "16/B374D848"
    assert lsn_text(0x0000_0001_0000_000A) == "1/A"


def test_show_hosts_has_a_row_per_host_with_role_state_ban_and_lag() -> None:
    clock = Clock()
    runtime, _, hosts = split_runtime(clock)
    hosts.hosts[0].routed = 7
    hosts.hosts[1].routed = 3
    clock.now += 0.25

    table = show_hosts(runtime)

    assert table.columns == [
        ("database", TEXT),
        ("host", TEXT),
        ("port", INT4),
        ("role", TEXT),
        ("state", TEXT),
        ("banned_for", NUMERIC),
        ("reason", TEXT),
        ("lag_bytes", NUMERIC),
        ("lag_seconds", NUMERIC),
        ("lsn", TEXT),
        ("last_check", NUMERIC),
        ("routed", INT8),
    ]
    primary, replica, banned = by_name(table)
    assert primary == {
        "database": "app",
        "host": "a",
        "port": 5432,
        "role": "primary",
        "state": "up",
        "banned_for": "0.000",
        "reason": "",
        "lag_bytes": 0,
        "lag_seconds": "0.000",
        "lsn": "1/500",
        "last_check": "0.250",
        "routed": 7,
    }
    assert replica == {
        "database": "app",
        "host": "b",
        "port": 5433,
        "role": "replica",
        "state": "up",
        "banned_for": "0.000",
        "reason": "",
        "lag_bytes": 0x300,
        "lag_seconds": "1.500",
        "lsn": "1/200",
        "last_check": "0.250",
        "routed": 3,
    }
    assert banned == {
        "database": "app",
        "host": "c",
        "port": 5434,
        "role": "unknown",
        "state": "banned",
        "banned_for": "0.750",
        "reason": "connection refused",
        "lag_bytes": 0,
        "lag_seconds": "0.000",
        "lsn": None,
        "last_check": None,
        "routed": 0,
    }


def test_a_host_never_checked_is_unknown_and_a_ban_run_out_shows_zero() -> None:
    clock = Clock()
    runtime = Runtime(Config.default(), {})
    home = runtime.registry.get_pool(SPLIT, "u")
    assert home.split is not None
    hosts = home.split.hosts
    hosts.clock = clock
    assert [
        (r["state"], r["role"], r["last_check"], r["lsn"]) for r in by_name(show_hosts(runtime))
    ] == [("unknown", "unknown", None, None)] * 3
    hosts.check_failed(0, "timeout")
    clock.now += 5.0  # the ban ran out; its host is not up until a check passes
    row = by_name(show_hosts(runtime))[0]
    assert (row["state"], row["banned_for"], row["reason"]) == ("banned", "0.000", "timeout")


def test_show_hosts_without_split_is_empty_and_is_in_the_command_table_and_help() -> None:
    runtime = Runtime(Config.default(), {})
    runtime.registry.get_pool(DatabaseEntry(name="plain"), "u")
    assert show_hosts(runtime).rows == []
    assert SHOW_TABLES["hosts"] is show_hosts
    assert "HOSTS" in HELP


# --- SHOW SERVERS: role and lag ------------------------------------------------------------------


def test_show_servers_ends_with_role_and_lag_of_each_servers_host() -> None:
    clock = Clock()
    runtime, home, hosts = split_runtime(clock)
    assert home.split is not None
    replica_pool = home.split.make(1)
    home.split.replicas[1] = replica_pool
    on_primary = FakeServer(home, ("a", 5432))
    connecting = FakeServer(home)  # its target is not known yet
    on_replica = FakeServer(replica_pool, ("b", 5433))
    on_replica.client = object()
    home.idle.append(on_primary)
    home.login.add(connecting)
    replica_pool.active.add(on_replica)

    table = show_servers(runtime)

    assert table.columns == [*SOCKET_COLUMNS, ("role", TEXT), ("lag", NUMERIC)]
    got = {
        row["id"]: (row["database"], row["user"], row["role"], row["lag"]) for row in by_name(table)
    }
    assert got == {
        on_primary.id: ("app", "u", "primary", 0),
        connecting.id: ("app", "u", "unknown", 0),
        on_replica.id: ("app", "u", "replica", 0x300),
    }
    # the replica is promoted: its servers say so
    hosts.check_passed(1, False, 0x1_0000_0600, 0.0, clock.now)
    roles = {row["id"]: row["role"] for row in by_name(show_servers(runtime))}
    assert roles[on_replica.id] == "primary"


def test_show_servers_role_and_lag_are_null_without_split() -> None:
    runtime = Runtime(Config.default(), {})
    pool = runtime.registry.get_pool(DatabaseEntry(name="plain", host="a"), "u")
    pool.idle.append(FakeServer(pool, ("a", 5432)))
    (row,) = by_name(show_servers(runtime))
    assert (row["role"], row["lag"]) == (None, None)


def test_show_sockets_keeps_its_columns() -> None:
    columns = [c for c, _ in show_sockets(Runtime(Config.default(), {})).columns]
    assert "role" not in columns and "lag" not in columns


# --- SHOW POOLS: a replica's pool is folded into its home pool's row -----------------------------


def test_show_pools_folds_a_replica_pools_servers_and_waiters_into_the_home_row() -> None:
    clock = Clock()
    runtime, home, _ = split_runtime(clock)
    assert home.split is not None
    replica_pool = home.split.make(1)
    home.split.replicas[1] = replica_pool
    reader, writer, idle_client = Waiter(), Waiter(), Waiter()
    for client in (reader, writer, idle_client):
        home.client_joined(client)
    home.waiting.append(writer, home.clock())
    replica_pool.waiting.append(reader, replica_pool.clock() - 2.0)
    home.idle.append(FakeServer(home, ("a", 5432)))
    replica_pool.idle.append(FakeServer(replica_pool, ("b", 5433)))
    replica_pool.login.add(FakeServer(replica_pool, ("b", 5433)))
    busy = FakeServer(replica_pool, ("b", 5433))
    busy.client = object()
    replica_pool.active.add(busy)

    table = show_pools(runtime)

    rows = [r for r in by_name(table) if r["database"] == "app"]
    assert len(rows) == 1
    (row,) = rows
    assert (row["cl_active"], row["cl_waiting"]) == (1, 2)
    assert (row["sv_active"], row["sv_idle"], row["sv_login"]) == (1, 2, 1)
    assert row["maxwait"] == 2
    assert row["pool_mode"] == home.pool_mode
    assert table.columns == SHOW_TABLES["pools"](Runtime(Config.default(), {})).columns


# --- workers = N ---------------------------------------------------------------------------------


def test_show_hosts_merge_adds_routed_and_keeps_the_worst_of_ban_lag_and_check_age() -> None:
    columns = show_hosts(Runtime(Config.default(), {})).columns

    def row(
        host: str,
        port: int,
        state: str,
        banned_for: str,
        lag: int,
        lag_s: str,
        last_check: str | None,
        routed: int,
    ) -> list[Any]:
        return [
            "app",
            host,
            port,
            "replica",
            state,
            banned_for,
            "",
            lag,
            lag_s,
            "1/200",
            last_check,
            routed,
        ]

    w0 = Table(
        columns,
        [
            row("a", 5432, "up", "0.000", 0, "0.000", "0.100", 5),
            row("b", 5433, "up", "0.000", 100, "0.250", None, 1),
        ],
    )
    w1 = Table(
        columns,
        [
            row("a", 5432, "up", "0.000", 0, "0.000", "0.900", 2),
            row("b", 5433, "banned", "1.500", 40, "2.000", None, 4),
        ],
    )

    out = merge("hosts", [(1, w1), (0, w0)])

    assert out.columns == columns
    a, b = by_name(out)
    assert (a["host"], a["routed"], a["last_check"], a["state"]) == ("a", 7, "0.900", "up")
    assert (
        b["host"],
        b["routed"],
        b["banned_for"],
        b["lag_bytes"],
        b["lag_seconds"],
        b["last_check"],
        b["state"],
    ) == ("b", 5, "1.500", 100, "2.000", None, "up")


@pytest.mark.parametrize("what", ["pools", "servers", "hosts"])
def test_the_tables_merge_with_their_columns(what: str) -> None:
    clock = Clock()
    runtime, _, _ = split_runtime(clock)
    table = SHOW_TABLES[what](runtime)
    assert merge(what, [(0, table), (1, table)]).columns[: len(table.columns)] == table.columns
