"""The SHOW tables: PgBouncer's columns, in its order and types, built from the live state.

Counts are the sizes of the containers connections sit in (see ``pool.pool``); totals come
from the pools' counters (``pool.stats``); averages from the last completed stats period.
The Prometheus endpoint reads the same tables, so both always agree.

Long: one table per SHOW command, each a column list and a row builder side by side; they share
helpers and are read together against PgBouncer's column order, so one file.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

from ..native.buildinfo import VERSION_LINE
from ..net.tls import describe
from ..pool.cancels import cancels_in_flight
from ..pool.pool import Pool, PooledServer
from ..pool.stats import Totals, sum_totals
from ..runtime import Runtime
from ..views.protocols import ClientView, ServerView
from ..views.states import ClientState
from .split import fold_pool_row, host_rows, server_role

TEXT = 25
INT4 = 23
INT8 = 20
NUMERIC = 1700

ADMIN_DB = "pgbouncer"

Value = str | int | None


@dataclass
class Table:
    """A result set: (column name, type oid) pairs and rows of text, integers or NULL."""

    columns: list[tuple[str, int]]
    rows: list[list[Value]]

    def column(self, name: str) -> list[Value]:
        index = [c for c, _ in self.columns].index(name)
        return [row[index] for row in self.rows]


def _columns(spec: str, names: str) -> list[tuple[str, int]]:
    """Columns from PgBouncer-style type letters: s text, i int4, q int8, N numeric."""
    oids = {"s": TEXT, "i": INT4, "q": INT8, "N": NUMERIC, "T": TEXT}
    split = names.split()
    assert len(spec) == len(split)
    return [(name, oids[letter]) for letter, name in zip(spec, split, strict=True)]


def display_time(wall: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(wall))


def _wall(monotonic_at: float, now: float) -> float:
    """Wall-clock time of a monotonic instant, for display only."""
    return time.time() - (now - monotonic_at)


def _split_addr(addr: str) -> tuple[str, int]:
    if not addr or addr == "unix" or ":" not in addr:
        return (addr or "unix"), 0
    host, _, port = addr.rpartition(":")
    return host, int(port) if port.isdigit() else 0


def _ptr(obj: object | None) -> str:
    return "" if obj is None else f"0x{id(obj):x}"


def _seconds_us(seconds: float) -> tuple[int, int]:
    whole = int(seconds)
    return whole, int((seconds - whole) * 1_000_000)


# --- who is where --------------------------------------------------------------------------------


def client_state(client: ClientView) -> str | None:
    """PgBouncer's client state; None for a client still logging in (not listed)."""
    state = client.state
    if state is ClientState.READY:
        if client.server is not None:
            return "active"
        return "waiting" if client.waiting else "idle"
    if state is ClientState.WELCOME:
        return "waiting"
    if state is ClientState.ADMIN:
        return "idle"
    if state is ClientState.REPLICATION:
        return "active"
    return None


def logged_in_clients(runtime: Runtime) -> list[ClientView]:
    """Clients past login: those that joined a pool, those waiting for a pool's welcome,
    and the admin sessions."""
    clients: list[ClientView] = list(runtime.admin_clients)
    clients.extend(c for c in runtime.clients.values() if c.joined)
    for pool in runtime.registry:
        # the pools hold them as waiters; they are client connections all the same
        clients.extend(cast(ClientView, c) for c in pool.welcome_waiters)
    return sorted(clients, key=lambda c: c.id)


def client_database(client: ClientView) -> str:
    pool = client.pool
    return pool.database if pool is not None else ADMIN_DB


def server_state(server: ServerView, now: float) -> str:
    if server.replication:  # its client's own: linked until either side leaves
        return "active"
    pool = server.pool
    if server in pool.active:
        return "active" if server.client is not None else "idle"
    if server in pool.tested:
        return "tested"
    if server in pool.login or server in pool.being_canceled:
        return "new" if server in pool.login else "being_canceled"
    if _unchecked_too_long(pool, server.last_used, now):
        return "used"
    return "idle"


def _unchecked_too_long(pool: Pool[Any], last_used: float, now: float) -> bool:
    """Whether an idle server shows as "used": unused longer than server_check_delay, it is
    checked before its next client."""
    return pool.check_delay is not None and now - last_used > pool.check_delay


def _pools(runtime: Runtime) -> list[Pool[PooledServer]]:
    """Every pool; a split database's home pool before its replicas' (same database, user)."""
    return sorted(runtime.registry, key=lambda p: (p.database, p.user, p.host_index))


# --- SHOW POOLS / CLIENTS / SERVERS --------------------------------------------------------------

POOLS_COLUMNS = _columns(
    "ssiiiiiiiiiiiiiss",
    "database user cl_active cl_waiting cl_active_cancel_req cl_waiting_cancel_req sv_active"
    " sv_active_cancel sv_being_canceled sv_idle sv_used sv_tested sv_login maxwait maxwait_us"
    " pool_mode load_balance_hosts",
)


def show_pools(runtime: Runtime) -> Table:
    now = time.monotonic()
    rows: list[list[Value]] = [
        [
            ADMIN_DB,
            ADMIN_DB,
            len(runtime.admin_clients),
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            "statement",
            None,
        ]
    ]
    by_pool: dict[tuple[str, str], list[Value]] = {}
    for pool in _pools(runtime):
        used = sum(1 for s in pool.idle if _unchecked_too_long(pool, s.last_used, now))
        maxwait, maxwait_us = _seconds_us(pool.max_wait(now))
        db = runtime.registry.databases.get(pool.database)
        row: list[Value] = [
            pool.database, pool.user, pool.active_client_count, pool.waiting_client_count,
            pool.cancel_requests, 0, len(pool.active), cancels_in_flight(pool),
            len(pool.being_canceled), len(pool.idle) - used, used, len(pool.tested),
            len(pool.login), maxwait, maxwait_us, pool.pool_mode,
            db.load_balance_hosts or "round-robin" if db is not None and len(db.hosts) > 1
            else None,
        ]  # fmt: skip
        home = by_pool.get((pool.database, pool.user))
        if home is None:
            rows.append(by_pool.setdefault((pool.database, pool.user), row))
        else:
            fold_pool_row(home, row)
    rows.sort(key=lambda r: (str(r[0]), str(r[1])))
    return Table(POOLS_COLUMNS, rows)


SOCKET_COLUMNS = _columns(
    "ssssssisiTTiiississii",
    "type user database replication state addr port local_addr local_port connect_time"
    " request_time wait wait_us close_needed ptr link remote_pid tls application_name"
    " prepared_statements id",
)

#: SHOW CLIENTS: PgBouncer's columns, then pgtarn's own: why the client keeps its server, and
#: the names of the session settings it changed.
CLIENT_COLUMNS = SOCKET_COLUMNS + _columns("ss", "pinned tracked_settings")


def _client_row(client: ClientView, now: float) -> list[Value]:
    """A client's SOCKET_COLUMNS."""
    addr, port = _split_addr(client.addr)
    local, local_port = _split_addr(client.local_addr)
    wait, wait_us = _seconds_us(now - client.query_start if client.query_start else 0.0)
    request = client.last_request
    return [
        "C", client.user, client_database(client), client.replication or "none",
        client_state(client), addr, port,
        local, local_port, display_time(client.connect_time),
        display_time(_wall(request, now) if request else client.connect_time),
        wait, wait_us, 0, _ptr(client), _ptr(client.server), client.peer_pid,
        describe(client.tls),
        client.params.get("application_name", ""),
        len(client.statements.names) if client.statements is not None else 0, client.id,
    ]  # fmt: skip


def show_clients(runtime: Runtime) -> Table:
    now = time.monotonic()
    rows: list[list[Value]] = []
    for client in logged_in_clients(runtime):
        rows.append(
            [
                *_client_row(client, now),
                ",".join(client.pin_reasons()),
                ",".join(client.tracked_settings()),
            ]
        )
    return Table(CLIENT_COLUMNS, rows)


def all_servers(runtime: Runtime) -> list[ServerView]:
    """The pools' servers and the replication clients' own ones."""
    servers = runtime.servers()
    servers.extend(
        c.server for c in runtime.clients.values() if c.replication and c.server is not None
    )
    return sorted(servers, key=lambda s: s.id)


def _server_row(server: ServerView, now: float) -> list[Value]:
    """A server's SOCKET_COLUMNS."""
    pool = server.pool
    addr, port = _split_addr(server.peer)
    local, local_port = _split_addr(server.local_addr)
    statements = server.statements
    return [
        "S", pool.user, pool.database, server.replication or "none",
        server_state(server, now), addr, port,
        local, local_port, display_time(server.connect_time),
        display_time(_wall(server.last_used, now)), 0, 0, int(server.close_needed),
        _ptr(server), _ptr(server.client), server.backend_key[0], describe(server.transport),
        server.params.get("application_name", ""),
        len(statements.prepared) if statements is not None else 0, server.id,
    ]  # fmt: skip


#: SHOW SERVERS: PgBouncer's columns, then pgtarn's own (read/write split): the role of the
#: server's host and a replica's lag in bytes; NULL for a database without split.
SERVER_COLUMNS = SOCKET_COLUMNS + _columns("sN", "role lag")


def show_servers(runtime: Runtime) -> Table:
    now = time.monotonic()
    return Table(
        SERVER_COLUMNS, [[*_server_row(s, now), *server_role(s)] for s in all_servers(runtime)]
    )


#: SHOW SOCKETS: PgBouncer's debug columns of its socket buffers.  pgtarn has no such
#: buffers: send_remain is what the transport has not sent yet, the others are 0.
SOCKETS_COLUMNS = SOCKET_COLUMNS + _columns(
    "iiiiiii", "recv_pos pkt_pos pkt_remain send_pos send_remain pkt_avail send_avail"
)


def _unsent(transport: asyncio.Transport | None) -> int:
    if transport is not None and not transport.is_closing():
        return transport.get_write_buffer_size()
    return 0


def show_sockets(runtime: Runtime, active_only: bool = False) -> Table:
    """Every client (logged in) and server connection, with SOCKETS_COLUMNS."""
    now = time.monotonic()
    rows: list[list[Value]] = []
    for client in logged_in_clients(runtime):
        unsent = _unsent(client.transport)
        rows.append([*_client_row(client, now), 0, 0, 0, 0, unsent, 0, 0])
    for server in all_servers(runtime):
        unsent = _unsent(server.transport)
        rows.append([*_server_row(server, now), 0, 0, 0, 0, unsent, 0, 0])
    if active_only:  # as PgBouncer: the sockets with data under way
        rows = [r for r in rows if r[-3]]
    return Table(SOCKETS_COLUMNS, rows)


def show_active_sockets(runtime: Runtime) -> Table:
    return show_sockets(runtime, active_only=True)


PEERS_COLUMNS = _columns("isii", "peer_id host port pool_size")


def show_peers(runtime: Runtime) -> Table:
    """The [peers] entries: where cancels for each peer_id go, and how many at once."""
    config = runtime.config
    rows: list[list[Value]] = [
        [peer.peer_id, peer.host, peer.port, config.peer_pool_size_for(peer)]
        for _, peer in sorted(config.peers.items())
    ]
    return Table(PEERS_COLUMNS, rows)


PEER_POOLS_COLUMNS = _columns(
    "iiiii", "peer_id cl_active_cancel_req cl_waiting_cancel_req sv_active_cancel sv_login"
)


def show_peer_pools(runtime: Runtime) -> Table:
    """Each peer's cancels under way: sent and waiting for the peer to close (active), not
    sent yet (waiting for a slot of its pool_size, or connecting), connections connecting."""
    rows: list[list[Value]] = []
    for peer_id in sorted(runtime.config.peers):
        pool = runtime.peers.pools.get(peer_id)
        if pool is None:
            rows.append([peer_id, 0, 0, 0, 0])
        else:
            rows.append(
                [peer_id, pool.sent, pool.waiting + pool.connecting, pool.sent, pool.connecting]
            )
    return Table(PEER_POOLS_COLUMNS, rows)


# --- SHOW STATS and friends ----------------------------------------------------------------------


def database_totals(runtime: Runtime) -> dict[str, Totals]:
    """Totals since start per database (its pools summed), the admin console included."""
    out: dict[str, Totals] = {}
    admin = Totals()
    admin.add_pool(runtime.admin_stats, 0, 0, 0)
    out[ADMIN_DB] = admin
    for pool in runtime.registry:
        totals = out.setdefault(pool.database, Totals())
        counters = pool.prepared_counters
        totals.add_pool(pool.stats, counters.client_parses, counters.server_parses, counters.binds)
    return dict(sorted(out.items()))


STATS_NAMES = (
    "server_assignment_count",
    "xact_count",
    "query_count",
    "received",
    "sent",
    "xact_time",
    "query_time",
    "wait_time",
    "client_parse_count",
    "server_parse_count",
    "bind_count",
    "client_login_count",
)
#: The same counters in SHOW STATS_TOTALS (PgBouncer's names: bytes_ for the byte counts).
TOTALS_NAMES = tuple(
    {"received": "bytes_received", "sent": "bytes_sent"}.get(name, name) for name in STATS_NAMES
)
#: SHOW STATS' averages, after their avg_ (PgBouncer's avg_recv).
AVG_STATS_NAMES = tuple({"received": "recv"}.get(name, name) for name in STATS_NAMES)
#: SHOW STATS_AVERAGES' columns: the parse, bind and login counts with avg_, the others as
#: in STATS_TOTALS (PgBouncer's names).
AVG_TOTALS_NAMES = tuple(
    f"avg_{name}" if "parse" in name or "bind" in name or "login" in name else name
    for name in TOTALS_NAMES
)
STATS_COLUMNS = (
    [("database", TEXT)]
    + [(f"total_{name}", NUMERIC) for name in STATS_NAMES]
    + [(f"avg_{name}", NUMERIC) for name in AVG_STATS_NAMES]
)
STATS_TOTALS_COLUMNS = [("database", TEXT)] + [(name, NUMERIC) for name in TOTALS_NAMES]
STATS_AVERAGES_COLUMNS = [("database", TEXT)] + [(name, NUMERIC) for name in AVG_TOTALS_NAMES]


def _averages_for(runtime: Runtime, database: str) -> Totals:
    return runtime.averages.get(database) or Totals()


def show_stats(runtime: Runtime) -> Table:
    rows: list[list[Value]] = []
    for database, totals in database_totals(runtime).items():
        avg = _averages_for(runtime, database)
        rows.append([database, *totals.values(), *avg.values()])
    return Table(STATS_COLUMNS, rows)


def show_stats_totals(runtime: Runtime) -> Table:
    rows: list[list[Value]] = [
        [database, *totals.values()] for database, totals in database_totals(runtime).items()
    ]
    return Table(STATS_TOTALS_COLUMNS, rows)


def show_stats_averages(runtime: Runtime) -> Table:
    rows: list[list[Value]] = [
        [database, *_averages_for(runtime, database).values()]
        for database in database_totals(runtime)
    ]
    return Table(STATS_AVERAGES_COLUMNS, rows)


_TOTALS_ROW_NAMES = (
    "server_assignment_count",
    "xact_count",
    "query_count",
    "client_bytes",
    "server_bytes",
    "xact_time",
    "query_time",
    "wait_time",
    "ps_client_parse_count",
    "ps_server_parse_count",
    "ps_bind_count",
    "client_login_count",
)


def show_totals(runtime: Runtime) -> Table:
    total = sum_totals(database_totals(runtime).values())
    avg = runtime.overall_averages
    rows: list[list[Value]] = []
    for prefix, totals in (("total_", total), ("avg_", avg)):
        for name, value in zip(_TOTALS_ROW_NAMES, totals.values(), strict=True):
            rows.append([prefix + name, value])
    return Table(_columns("sN", "name value"), rows)


# --- SHOW DATABASES / USERS / LISTS / STATE / CONFIG / VERSION -----------------------------------

DATABASES_COLUMNS = _columns(
    "ssissiiiissiiiiii",
    "name host port database force_user pool_size min_pool_size reserve_pool_size"
    " server_lifetime pool_mode load_balance_hosts max_connections current_connections"
    " max_client_connections current_client_connections paused disabled",
)


def _connections(pool: Pool[Any]) -> int:
    """A pool's connections to PostgreSQL as max_db/user_connections count them: its servers
    and its listener connection."""
    return pool.server_count + (pool.board.open_links if pool.board is not None else 0)


def _count_by(items: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


def show_databases(runtime: Runtime) -> Table:
    config = runtime.config
    registry = runtime.registry
    client_counts = {ADMIN_DB: len(runtime.admin_clients)}
    server_counts: dict[str, int] = {}
    for pool in registry:
        server_counts[pool.database] = server_counts.get(pool.database, 0) + _connections(pool)
        client_counts[pool.database] = client_counts.get(pool.database, 0) + pool.client_count
    entries = {name: db for name, db in registry.databases.items()}
    entries.update((name, db) for name, db in config.databases.items() if name != "*")
    rows: list[list[Value]] = [[
        ADMIN_DB, None, config.listen_port, ADMIN_DB, ADMIN_DB, 2, 0, 0, 0, "statement", None,
        0, 0, config.max_db_client_connections, client_counts.get(ADMIN_DB, 0), 0, 0,
    ]]  # fmt: skip
    for name, db in sorted(entries.items()):
        lifetime = db.server_lifetime if db.server_lifetime is not None else config.server_lifetime
        rows.append([
            name, ",".join(db.hosts) if db.hosts else db.host, db.port, db.dbname, db.user,
            config.pool_size_for(db, db.user or ""), config.min_pool_size_for(db),
            db.reserve_pool_size if db.reserve_pool_size is not None
            else config.reserve_pool_size,
            int(lifetime), db.pool_mode,
            (db.load_balance_hosts or "round-robin") if len(db.hosts) > 1 else None,
            config.max_db_connections_for(db), server_counts.get(name, 0),
            config.max_db_client_connections_for(db),
            client_counts.get(name, 0), int(registry.is_paused(name)),
            int(name in registry.disabled),
        ])  # fmt: skip
    rows.sort(key=lambda r: str(r[0]))
    return Table(DATABASES_COLUMNS, rows)


USERS_COLUMNS = _columns(
    "ssssiiii",
    "name pool_size reserve_pool_size pool_mode max_user_connections current_connections"
    " max_user_client_connections current_client_connections",
)


def show_users(runtime: Runtime) -> Table:
    config = runtime.config
    # by the user a client logged in as: a pool with a forced user holds other users' clients
    clients = _count_by(c.user for c in logged_in_clients(runtime))
    # with auth_query, users known only by their logins
    names = (
        set(config.users)
        | set(runtime.userlist)
        | {p.user for p in runtime.registry}
        | set(clients)
    )
    servers: dict[str, int] = {}
    for pool in runtime.registry:
        servers[pool.user] = servers.get(pool.user, 0) + _connections(pool)
    rows: list[list[Value]] = []
    for name in sorted(names):
        entry = config.users.get(name)
        max_clients = config.max_user_client_connections_for(name)
        rows.append([
            name,
            f"{entry.pool_size:9d}" if entry is not None and entry.pool_size is not None else "",
            f"{entry.reserve_pool_size:9d}"
            if entry is not None and entry.reserve_pool_size is not None else "",
            entry.pool_mode if entry is not None else None,
            config.max_user_connections_for(name), servers.get(name, 0), max_clients,
            clients.get(name, 0),
        ])  # fmt: skip
    return Table(USERS_COLUMNS, rows)


LIST_NAMES = (
    "databases",
    "users",
    "peers",
    "pools",
    "peer_pools",
    "free_clients",
    "used_clients",
    "login_clients",
    "free_servers",
    "used_servers",
    "dns_names",
    "dns_zones",
    "dns_queries",
    "dns_pending",
)


def show_lists(runtime: Runtime) -> Table:
    counts = {
        "databases": len(show_databases(runtime).rows),
        "users": len(show_users(runtime).rows),
        "pools": len(runtime.registry.pools),
        "peers": len(runtime.config.peers),
        "peer_pools": len(runtime.config.peers),
        "used_clients": len(runtime.clients),
        "login_clients": len(runtime.logins),
        "used_servers": len(all_servers(runtime)),
    }
    return Table(_columns("si", "list items"), [[name, counts.get(name, 0)] for name in LIST_NAMES])


def show_state(runtime: Runtime) -> Table:
    paused = runtime.registry.paused and not runtime.suspended
    rows: list[list[Value]] = [
        ["active", "no" if runtime.registry.paused or runtime.suspended else "yes"],
        ["paused", "yes" if paused else "no"],
        ["suspended", "yes" if runtime.suspended else "no"],
    ]
    return Table(_columns("ss", "key value"), rows)


def show_config(runtime: Runtime) -> Table:
    rows: list[list[Value]] = [
        [key, value, default, "yes" if changeable else "no"]
        for key, value, default, changeable in runtime.config.settings_rows()
    ]
    return Table(_columns("ssss", "key value default changeable"), rows)


def show_version(runtime: Runtime) -> Table:
    return Table(_columns("s", "version"), [[VERSION_LINE]])


def show_prepared_statements(runtime: Runtime) -> Table:
    """pgtarn's own: the shared statements, how many client names and servers have each."""
    on_servers = Counter(
        name
        for server in all_servers(runtime)
        if server.statements is not None
        for name in server.statements.prepared
    )
    rows: list[list[Value]] = [
        [
            stmt.name.decode(),
            stmt.query,
            stmt.parameter_count,
            stmt.clients,
            on_servers[stmt.name],
            stmt.generation,
            stmt.renewals,
            int(stmt.described),
        ]
        for stmt in runtime.statement_cache.statements()
    ]
    rows.sort(key=lambda r: str(r[0]))
    return Table(
        _columns("ssiiiiii", "name query parameters clients servers generation renewals described"),
        rows,
    )


LISTENERS_COLUMNS = _columns("sssi", "database user channel clients")


def show_listeners(runtime: Runtime) -> Table:
    """pgtarn's own: the channels clients LISTEN to through a pool's listener connection
    (transaction and statement mode), and how many clients listen to each."""
    rows: list[list[Value]] = []
    for pool in _pools(runtime):
        board = pool.board
        if board is None:
            continue
        for channel, clients in sorted(board.subscribers.items()):
            if clients:
                rows.append([pool.database, pool.user, channel, len(clients)])
    return Table(LISTENERS_COLUMNS, rows)


HOSTS_COLUMNS = _columns(
    "ssissNsNNsNq",
    "database host port role state banned_for reason lag_bytes lag_seconds lsn last_check routed",
)


def show_hosts(runtime: Runtime) -> Table:
    """pgtarn's own: the servers of each read/write split database as its health checks see
    them (admin/split.py), and the transactions routed to each."""
    return Table(HOSTS_COLUMNS, host_rows(runtime.registry))
