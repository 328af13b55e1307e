"""Descriptions of the admin console: its SHOW tables and their columns, and its commands."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ShowDoc:
    """One SHOW: what its rows are; `pgtarn_only` when PgBouncer has no such SHOW, `extra`
    naming columns pgtarn adds to PgBouncer's."""

    text: str
    pgtarn_only: bool = False
    extra: tuple[str, ...] = ()


@dataclass(frozen=True)
class CommandDoc:
    """One command of the console: its syntax and what it does."""

    syntax: str
    text: str
    pgtarn_only: bool = False
    differs: str = ""


#: SHOW tables only admin_users may read (the others: stats_users too).
ADMIN_ONLY_SHOWS = frozenset({"prepared_statements"})
#: PgBouncer's SHOW commands pgtarn does not have, and why.
MISSING_SHOWS = {
    "fds": "file descriptors for PgBouncer's online restart; pgtarn's `--reboot` hands its "
    "sockets over another way",
}

SHOWS: dict[str, ShowDoc] = {
    "pools": ShowDoc("A row per pool (database and user): its clients and servers by state."),
    "clients": ShowDoc(
        "A row per client past its login, admin console sessions included.",
        extra=("pinned", "tracked_settings"),
    ),
    "servers": ShowDoc(
        "A row per server connection of the pools, and each replication client's own server.",
        extra=("role", "lag"),
    ),
    "stats": ShowDoc(
        "A row per database: totals since start, and averages over the last "
        "complete `stats_period`. Times are in microseconds."
    ),
    "stats_totals": ShowDoc("SHOW STATS' totals alone."),
    "stats_averages": ShowDoc("SHOW STATS' averages alone."),
    "totals": ShowDoc(
        "SHOW STATS summed over all databases, one row per figure (`total_...` and `avg_...`)."
    ),
    "databases": ShowDoc(
        "A row per database: the `[databases]` entries, those made from `*`, "
        "and the console's own `pgbouncer`."
    ),
    "users": ShowDoc(
        "A row per user known: from `[users]`, `auth_file`, the pools and the clients logged in."
    ),
    "lists": ShowDoc("Counts of pgtarn's objects, one row each."),
    "mem": ShowDoc(
        "What pgtarn holds, a row per kind of object (clients, servers, pools, "
        "prepared statements, ...): how many and their shallow sizes. Python frees "
        "an object with its last reference, so nothing is kept free for reuse."
    ),
    "dns_hosts": ShowDoc(
        "PgBouncer's DNS cache. pgtarn asks the system's resolver at each "
        "server connection and keeps no cache: no rows."
    ),
    "dns_zones": ShowDoc(
        "PgBouncer's DNS zones checked for changes. pgtarn keeps no DNS cache: no rows."
    ),
    "state": ShowDoc("Whether pgtarn is active, paused or suspended."),
    "config": ShowDoc(
        "A row per `[pgbouncer]` setting: its value in force, its default and "
        "whether RELOAD or SET may change it."
    ),
    "version": ShowDoc(
        "PgBouncer's version line, with pgtarn's version and build in "
        "parentheses, for the tools that parse it: `PgBouncer 1.25.2 (pgtarn "
        "x.y.z, compiled)`. `pgtarn --version` prints the same line first "
        "when its output is piped, and pgtarn's own line first on a "
        "terminal."
    ),
    "prepared_statements": ShowDoc(
        "A row per shared prepared statement (transaction and statement mode).", pgtarn_only=True
    ),
    "listeners": ShowDoc(
        "A row per channel that the clients of a pool listen to through its listener connection.",
        pgtarn_only=True,
    ),
    "sockets": ShowDoc(
        "SHOW CLIENTS' and SHOW SERVERS' rows with the buffer columns of "
        "PgBouncer's own debugging view."
    ),
    "active_sockets": ShowDoc("SHOW SOCKETS' rows with data still to send."),
    "peers": ShowDoc("A row per `[peers]` entry."),
    "peer_pools": ShowDoc("A row per peer: the cancel requests under way to it."),
    "hosts": ShowDoc(
        "A row per server host of each `read_write_split` database, as its health checks see it.",
        pgtarn_only=True,
    ),
}

_SOCKET = {
    "type": "`C` for a client, `S` for a server.",
    "user": "The user: the client's login name, or the user the server logged in as.",
    "database": "The database name (the console's is `pgbouncer`).",
    "replication": "`physical` or `logical` for a replication connection, else `none`.",
    "addr": "The peer's IP address, or `unix`.",
    "port": "The peer's port (0 for a unix socket).",
    "local_addr": "pgtarn's own address of the connection.",
    "local_port": "pgtarn's own port of the connection.",
    "connect_time": "When the connection was made (local time).",
    "request_time": "The client's last request; the server's last use.",
    "wait": "Seconds the client's current query has been under way (0 for servers).",
    "wait_us": "The microseconds part of `wait`.",
    "close_needed": "1 when the server is to be closed once released (RECONNECT, RELOAD).",
    "ptr": "An identifier of the connection object.",
    "link": "The `ptr` of the connection it is linked to (client to server and back).",
    "remote_pid": "A unix socket client's process id; a server's backend process id.",
    "tls": "TLS version and cipher, empty without TLS.",
    "application_name": "The connection's `application_name`.",
    "prepared_statements": "How many prepared statement names the client has, or how many "
    "statements are prepared on the server.",
    "id": "A number unique to the connection, which KILL_CLIENT takes.",
}
_SOCKET_STATES = {
    "clients": "`active` (has a server), `waiting` (for one) or `idle`.",
    "servers": "`active`, `idle`, `used` (idle past `server_check_delay`), `tested`, `new` "
    "(logging in) or `being_canceled`.",
}
_BUFFERS = {
    "recv_pos": "Always 0: pgtarn has no fixed receive buffer.",
    "pkt_pos": "Always 0.",
    "pkt_remain": "Always 0.",
    "send_pos": "Always 0.",
    "send_remain": "Bytes waiting to be sent on the connection.",
    "pkt_avail": "Always 0.",
    "send_avail": "Always 0.",
}

#: Each counter of SHOW STATS and its relatives: (what it counts, what its average is per:
#: "" for a count, averaged per second).
_STATS = {
    "server_assignment_count": ("times a server was assigned to a client", ""),
    "xact_count": ("SQL transactions pooled", ""),
    "query_count": ("queries pooled", ""),
    "received": ("bytes received from clients", ""),
    "sent": ("bytes sent to clients", ""),
    "xact_time": ("microseconds servers spent in transactions, running or idle", "transaction"),
    "query_time": ("microseconds servers spent running queries", "query"),
    "wait_time": ("microseconds clients waited for a server", "server assignment"),
    "client_parse_count": ("statements clients prepared", ""),
    "server_parse_count": ("statements prepared on servers", ""),
    "bind_count": ("executions of prepared statements", ""),
    "client_login_count": ("client logins", ""),
}
_TOTALS_NAMES = {"received": "bytes_received", "sent": "bytes_sent"}


def _total(name: str) -> str:
    return f"Since start: {_STATS[name][0]}."


def _average(name: str) -> str:
    what, per = _STATS[name]
    return f"Over the last stats period: {what}, per {per or 'second'}."


COLUMNS: dict[str, dict[str, str]] = {
    "pools": {
        "database": "The database.",
        "user": "The pool's user.",
        "cl_active": "Clients linked to a server, or idle with none.",
        "cl_waiting": "Clients waiting for a server.",
        "cl_active_cancel_req": "Clients' cancel connections waiting for their cancel to end.",
        "cl_waiting_cancel_req": "Always 0: a cancel is forwarded at once.",
        "sv_active": "Servers linked to a client.",
        "sv_active_cancel": "Cancel requests forwarded to PostgreSQL and not answered yet.",
        "sv_being_canceled": "Servers whose cancel is under way: lent to nobody until it ends.",
        "sv_idle": "Idle servers ready to be lent.",
        "sv_used": "Idle servers unused past `server_check_delay`, checked before reuse.",
        "sv_tested": "Servers running their reset or check query.",
        "sv_login": "Servers logging in.",
        "maxwait": "Seconds the oldest waiting client has waited.",
        "maxwait_us": "The microseconds part of `maxwait`.",
        "pool_mode": "The pool's mode.",
        "load_balance_hosts": "With a host list, its `load_balance_hosts`; else NULL.",
    },
    "clients": {
        **_SOCKET,
        "state": _SOCKET_STATES["clients"],
        "pinned": "Why the client keeps its server (session state), comma-separated.",
        "tracked_settings": "The names of the settings the client changed.",
    },
    "servers": {
        **_SOCKET,
        "state": _SOCKET_STATES["servers"],
        "role": "`primary`, `replica` or `unknown` with `read_write_split`; else NULL.",
        "lag": "A replica's bytes of WAL behind the primary; NULL without a split.",
    },
    "sockets": {**_SOCKET, **_BUFFERS, "state": "As in SHOW CLIENTS and SHOW SERVERS."},
    "stats": {
        "database": "The database.",
        **{f"total_{n}": _total(n) for n in _STATS},
        **{"avg_" + ("recv" if n == "received" else n): _average(n) for n in _STATS},
    },
    "stats_totals": {
        "database": "The database.",
        **{_TOTALS_NAMES.get(n, n): _total(n) for n in _STATS},
    },
    "stats_averages": {
        "database": "The database.",
        **{
            (
                f"avg_{n}"
                if n.endswith(("parse_count", "bind_count", "login_count"))
                else _TOTALS_NAMES.get(n, n)
            ): _average(n)
            for n in _STATS
        },
    },
    "totals": {
        "name": "The figure: `total_...` since start, `avg_...` over the last stats "
        "period, as in SHOW STATS.",
        "value": "Its value over all databases.",
    },
    "databases": {
        "name": "The name clients ask for.",
        "host": "The host, or the comma-separated host list; NULL for the unix socket.",
        "port": "The port.",
        "database": "The database on the server (`dbname`).",
        "force_user": "The forced `user=`, else NULL.",
        "pool_size": "The pool size in force.",
        "min_pool_size": "The minimum pool size in force.",
        "reserve_pool_size": "The reserve pool size in force.",
        "server_lifetime": "The server lifetime in force, in seconds.",
        "pool_mode": "The entry's own pool mode, else NULL.",
        "load_balance_hosts": "With a host list, its `load_balance_hosts`; else NULL.",
        "max_connections": "Its `max_db_connections` in force (0: none).",
        "current_connections": "Its server connections now, listener connections included.",
        "max_client_connections": "Its `max_db_client_connections` in force (0: none).",
        "current_client_connections": "Its clients now.",
        "paused": "1 while paused.",
        "disabled": "1 while disabled.",
    },
    "users": {
        "name": "The user.",
        "pool_size": "The `[users]` line's `pool_size`, else empty.",
        "reserve_pool_size": "The `[users]` line's `reserve_pool_size`, else empty.",
        "pool_mode": "The `[users]` line's `pool_mode`, else NULL.",
        "max_user_connections": "Its `max_user_connections` in force (0: none).",
        "current_connections": "Its server connections now, listener connections included.",
        "max_user_client_connections": "Its `max_user_client_connections` in force (0: none).",
        "current_client_connections": "Its clients now.",
    },
    "lists": {
        "list": "The kind of object (`databases`, `users`, `pools`, `used_clients`, ...; "
        "PgBouncer's free lists and DNS caches are always 0).",
        "items": "How many there are.",
    },
    "state": {"key": "`active`, `paused` or `suspended`.", "value": "`yes` or `no`."},
    "mem": {
        "name": "The kind of object.",
        "size": "Their average shallow size in bytes (`sys.getsizeof`).",
        "used": "How many there are.",
        "free": "Always 0: nothing is kept for reuse.",
        "memtotal": "The sum of their shallow sizes in bytes: a lower bound, since what "
        "an object refers to is not counted.",
    },
    "dns_hosts": {"hostname": "A host name.", "ttl": "Seconds left.", "addrs": "Its addresses."},
    "dns_zones": {"zonename": "A zone.", "serial": "Its SOA serial.", "count": "Host names in it."},
    "config": {
        "key": "The setting.",
        "value": "Its value in force.",
        "default": "Its default.",
        "changeable": "`yes` when RELOAD and SET may change it, `no`: restart only.",
    },
    "version": {"version": "The version line."},
    "prepared_statements": {
        "name": "The statement's name on the servers.",
        "query": "Its text.",
        "parameters": "Its number of parameters.",
        "clients": "How many client statement names stand for it.",
        "servers": "How many servers have it prepared.",
        "generation": "The schema generation it was prepared in.",
        "renewals": "Times it was renewed after a schema change or a stale plan.",
        "described": "1 when a client described it (its driver may cache its types).",
    },
    "listeners": {
        "database": "The pool's database.",
        "user": "The pool's user.",
        "channel": "The channel.",
        "clients": "Clients listening to it.",
    },
    "peers": {
        "peer_id": "The peer's id.",
        "host": "Its host or unix socket directory.",
        "port": "Its port.",
        "pool_size": "Cancels that may be in flight to it at once.",
    },
    "peer_pools": {
        "peer_id": "The peer's id.",
        "cl_active_cancel_req": "Cancels sent to it and not answered yet.",
        "cl_waiting_cancel_req": "Cancels waiting to be sent (for a slot, or connecting).",
        "sv_active_cancel": "Connections to it carrying a cancel.",
        "sv_login": "Connections to it being opened.",
    },
    "hosts": {
        "database": "The database.",
        "host": "The host.",
        "port": "Its port.",
        "role": "`primary`, `replica` or `unknown`.",
        "state": "`up`, `banned` (after a failed check or login) or `unknown` (not checked yet).",
        "banned_for": "Seconds left of a ban.",
        "reason": "Why it is banned.",
        "lag_bytes": "A replica's bytes of WAL behind the primary (0 for the primary).",
        "lag_seconds": "A replica's replay delay in seconds.",
        "lsn": "The LSN of its last check: the primary's insert position, a replica's replay "
        "position.",
        "last_check": "Seconds since its last passed check; NULL before one.",
        "routed": "Transactions sent to it.",
    },
}
COLUMNS["active_sockets"] = COLUMNS["sockets"]

COMMANDS: dict[str, CommandDoc] = {
    "pause": CommandDoc(
        "PAUSE [db]",
        (
            "Let the transactions under way (sessions, in session mode) finish, then close the "
            "servers; new work waits until RESUME. Answers once every server of the scope is "
            "released."
        ),
    ),
    "resume": CommandDoc("RESUME [db]", "Undo PAUSE or SUSPEND."),
    "suspend": CommandDoc(
        "SUSPEND",
        (
            "Stop reading every client and server socket (admin sessions aside) until RESUME; "
            "notifications wait in PostgreSQL."
        ),
    ),
    "kill": CommandDoc(
        "KILL [db]",
        (
            "Close every client and server of the database (or all) at once; new clients wait for "
            "RESUME."
        ),
    ),
    "kill_client": CommandDoc(
        "KILL_CLIENT id", ("Close one client, by the `id` SHOW CLIENTS gives, with FATAL 57P01.")
    ),
    "reconnect": CommandDoc(
        "RECONNECT [db]", ("Close the servers as they are released, so that new ones are opened.")
    ),
    "renew_statements": CommandDoc(
        "RENEW_STATEMENTS [db]",
        (
            "Prepare every shared prepared statement afresh before its next use, after a schema "
            "change made outside pgtarn."
        ),
        pgtarn_only=True,
    ),
    "wait_close": CommandDoc(
        "WAIT_CLOSE [db]", ("Answer once the servers marked by RECONNECT or RELOAD are closed.")
    ),
    "disable": CommandDoc("DISABLE db", "Refuse new logins to the database."),
    "enable": CommandDoc("ENABLE db", "Accept logins to a disabled database again."),
    "reload": CommandDoc(
        "RELOAD",
        (
            "Read the configuration, `auth_file`, the HBA and TLS files again. NOTICEs list the "
            "settings changed and those that change only at restart; an invalid file gives "
            "F0000 and the running configuration stays."
        ),
    ),
    "shutdown": CommandDoc(
        "SHUTDOWN [WAIT_FOR_SERVERS | WAIT_FOR_CLIENTS]",
        (
            "Stop at once, or once every server is released, or once every client has left; "
            "the listening sockets close first."
        ),
    ),
    "set": CommandDoc(
        "SET key = value",
        (
            "Change a setting whose SHOW CONFIG `changeable` is `yes`, with the effect RELOAD "
            "would have with that value in the file."
        ),
        differs="PgBouncer answers SET of a restart-only setting as if it worked; pgtarn "
        "refuses it with `SET failed: ...`, so SHOW CONFIG shows what is in force.",
    ),
}
