"""What the SHOW tables say of read/write split: each host's row, a server's role and lag, a
replica's pool in its home pool's row."""

from __future__ import annotations

from typing import Any, cast

from ..pool.hosts import REPLICA, UNKNOWN, HostSet, HostState
from ..pool.registry import Registry
from ..views.protocols import ServerView

Cell = str | int | None


def lsn_text(lsn: int) -> str:
    """An LSN as PostgreSQL prints one: the high and low 32 bits in hexadecimal."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def seconds_text(seconds: float) -> str:
    """Seconds in a numeric column, to the millisecond."""
    return f"{seconds:.3f}"


def host_state(host: HostState) -> str:
    """up; banned (by a failed check or login, until a check passes, even once its ban ran
    out); unknown before any check said either."""
    if host.up:
        return "up"
    return "banned" if host.banned_until else "unknown"


def host_row(hosts: HostSet, host: HostState, now: float) -> list[Cell]:
    """SHOW HOSTS' row of one host (now: the HostSet's clock)."""
    checked = host.checked_at
    return [
        hosts.name, host.host, host.port, host.role, host_state(host),
        seconds_text(max(0.0, host.banned_until - now)), host.reason, host.lag_bytes,
        seconds_text(host.lag_seconds), lsn_text(host.lsn) if checked else None,
        seconds_text(now - checked) if checked else None, host.routed,
    ]  # fmt: skip


def host_rows(registry: Registry[Any]) -> list[list[Cell]]:
    """A row per host of every HostSet, by database name, each set in its list's order."""
    rows: list[list[Cell]] = []
    for hosts in sorted(registry.hostsets.values(), key=lambda h: h.name):
        now = hosts.clock()
        rows.extend(host_row(hosts, host, now) for host in hosts.hosts)
    return rows


def server_host(server: ServerView) -> HostState | None:
    """The host of a split database's server: its replica pool's, or for a home pool's server
    the one it connected to (None: not connected yet, or not a split database's server)."""
    pool = server.pool
    split = pool.split
    if split is None:
        return None
    hosts = split.hosts.hosts
    if pool.host_index >= 0:
        return hosts[pool.host_index]
    target = server.target
    for host in hosts:
        if (host.host, host.port) == target:
            return host
    return None


def server_role(server: ServerView) -> list[Cell]:
    """SHOW SERVERS' role and lag: its host's current role and, for a replica, how many bytes
    of WAL it is behind; NULL for a server of a database without split."""
    if server.pool.split is None:
        return [None, None]
    host = server_host(server)
    if host is None:
        return [UNKNOWN, 0]
    return [host.role, host.lag_bytes if host.role == REPLICA else 0]


def fold_pool_row(home: list[Cell], replica: list[Cell]) -> None:
    """SHOW POOLS: a replica's pool has no row of its own; its servers and the readers
    waiting for them count in its home pool's row. Its cl_active is minus its waiting clients
    (they are logged in to the home pool, which counted them as active), so adding is right."""
    for i in range(2, 13):  # cl_active .. sv_login
        home[i] = cast(int, home[i]) + cast(int, replica[i])
    if (cast(int, replica[13]), cast(int, replica[14])) > (
        cast(int, home[13]),
        cast(int, home[14]),
    ):
        home[13:15] = replica[13:15]  # maxwait, maxwait_us: the longest wait
