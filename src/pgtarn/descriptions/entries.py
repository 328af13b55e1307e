"""Descriptions of the keys of [databases], [users] and [peers] lines."""

from __future__ import annotations

from .doc import KeyDoc

_CLIENT_PARAM = (
    "Sent to PostgreSQL at each server login as the `{name}` startup parameter; a client "
    "that sets its own still gets its own."
)

DATABASE_KEYS: dict[str, KeyDoc] = {
    "host": KeyDoc(
        "text",
        "unix socket in `unix_socket_dir`",
        (
            "The server to connect to: a host name or address, a unix socket directory (starting "
            "with `/`), or a comma-separated list of hosts. With a list, `load_balance_hosts` and "
            "`target_session_attrs` pick the host of each new server; a host that refuses or "
            "cannot be resolved is skipped within the same attempt."
        ),
        "PgBouncer fails that attempt and moves on at the next one.",
    ),
    "port": KeyDoc(
        "integer or list", "5432", ("The server's port, or libpq's list of one port per host.")
    ),
    "dbname": KeyDoc(
        "text",
        "the entry's name",
        ("The database on the server; the entry's name (the one clients ask for) when not set."),
    ),
    "user": KeyDoc(
        "text",
        "the client's user",
        (
            "Log in to the server as this user whoever the client is (a forced user): the "
            "database then has one pool for all its clients. Without it each client user gets a "
            "pool of its own, logged in as that user."
        ),
    ),
    "password": KeyDoc(
        "text",
        "from `auth_file`",
        (
            "The password for the forced `user`; without it the user's secret in `auth_file` (or "
            "the client's SCRAM keys, SCRAM passthrough) is used."
        ),
    ),
    "auth_user": KeyDoc(
        "text",
        "`auth_user`",
        ("This database's `auth_user`, for looking up users missing from `auth_file`."),
    ),
    "auth_query": KeyDoc(
        "text", "`auth_query`", ("This database's `auth_query` (quote it in single quotes).")
    ),
    "auth_dbname": KeyDoc(
        "text", "`auth_dbname`", ("The database entry this database's `auth_query` runs in.")
    ),
    "pool_size": KeyDoc(
        "integer", "`default_pool_size`", ("The most servers each pool of this database may have.")
    ),
    "min_pool_size": KeyDoc(
        "integer", "`min_pool_size`", ("Servers each pool of this database keeps open.")
    ),
    "reserve_pool_size": KeyDoc(
        "integer",
        "`reserve_pool_size`",
        ("This database's reserve (see the setting `reserve_pool_size`)."),
    ),
    "reserve_pool": KeyDoc(
        "integer", "`reserve_pool_size`", ("An older name of `reserve_pool_size`.")
    ),
    "pool_mode": KeyDoc(
        "session, transaction or statement",
        "`pool_mode`",
        ("This database's pool mode (a `[users]` line's wins)."),
    ),
    "max_db_connections": KeyDoc(
        "integer",
        "`max_db_connections`",
        ("The most servers of this database, all users together; 0 takes the global value."),
    ),
    "max_db_client_connections": KeyDoc(
        "integer",
        "`max_db_client_connections`",
        ("The most clients of this database at once; 0 takes the global value."),
    ),
    "server_lifetime": KeyDoc(
        "seconds", "`server_lifetime`", ("This database's `server_lifetime`.")
    ),
    "query_wait_timeout": KeyDoc(
        "seconds",
        "`query_wait_timeout`",
        ("How long this database's clients may wait for a server (a `[users]` line's wins)."),
    ),
    "connect_query": KeyDoc(
        "text",
        "none",
        (
            "A query run once on each new server after its login, before any client gets it. If "
            'it fails, the server is closed and the waiting clients get FATAL "connect_query '
            "failed: ...\" with PostgreSQL's SQLSTATE."
        ),
        "PgBouncer logs the error and uses the server anyway.",
    ),
    "load_balance_hosts": KeyDoc(
        "round-robin or disable",
        "round-robin",
        (
            "With a host list: `round-robin` opens each new server on the next host in turn; "
            "`disable` keeps to the host that last worked until it fails."
        ),
    ),
    "target_session_attrs": KeyDoc(
        "any, read-write, read-only, primary, standby or prefer-standby",
        "any",
        (
            "With a host list, which hosts fit, as libpq decides from what a server reports "
            "at login: a host that does not fit is passed over for the next one; when none "
            "fits, clients wait as for an unreachable server."
        ),
        pgtarn_only=True,
    ),
    "client_encoding": KeyDoc("text", "none", _CLIENT_PARAM.format(name="client_encoding")),
    "datestyle": KeyDoc("text", "none", _CLIENT_PARAM.format(name="DateStyle")),
    "timezone": KeyDoc("text", "none", _CLIENT_PARAM.format(name="TimeZone")),
    "application_name": KeyDoc("text", "none", _CLIENT_PARAM.format(name="application_name")),
    "read_write_split": KeyDoc(
        "off, explicit or auto",
        "off",
        (
            "Send read-only transactions to replicas of a host list. `explicit`: transactions "
            "that say they are read-only (`BEGIN READ ONLY`, `SET TRANSACTION READ ONLY`, "
            "`default_transaction_read_only`, the `NAME_ro` database). `auto`: also a single "
            "statement that is provably read-only. The servers' roles come from health checks, so "
            "a promoted standby becomes the primary without a RELOAD."
        ),
        pgtarn_only=True,
    ),
    "max_replica_lag": KeyDoc(
        "bytes or time",
        "no limit",
        (
            "A replica further behind than this gets no reads: bytes of WAL (`16MB`, PostgreSQL's "
            "1024-based units) or a time (`500ms`, `5s`, `1min`)."
        ),
        pgtarn_only=True,
    ),
    "primary_reads": KeyDoc(
        "boolean",
        "on",
        ("With `read_write_split`, reads may go to the primary as well as the replicas."),
        pgtarn_only=True,
    ),
    "read_your_writes": KeyDoc(
        "boolean",
        "on",
        (
            "With `read_write_split`, a client's reads after its own committed write go only to "
            "replicas that have replayed past it, else to the primary."
        ),
        pgtarn_only=True,
    ),
    "health_check_period": KeyDoc(
        "time",
        "1 s",
        (
            "With `read_write_split`, how often each server's role, reachability and lag are "
            "checked (seconds, or with `ms`, `s`, `min`)."
        ),
        pgtarn_only=True,
    ),
}

USER_KEYS: dict[str, KeyDoc] = {
    "pool_mode": KeyDoc(
        "session, transaction or statement",
        "the database's",
        ("The pool mode of this user's pools, before the database's and the global one."),
    ),
    "pool_size": KeyDoc(
        "integer", "the database's", ("The most servers each pool of this user may have.")
    ),
    "reserve_pool_size": KeyDoc("integer", "the database's", ("The reserve of this user's pools.")),
    "reserve_pool": KeyDoc("integer", "the database's", ("An older name of `reserve_pool_size`.")),
    "max_user_connections": KeyDoc(
        "integer",
        "`max_user_connections`",
        ("The most servers of this user, all databases together; 0 takes the global value."),
    ),
    "max_user_client_connections": KeyDoc(
        "integer",
        "`max_user_client_connections`",
        ("The most clients of this user at once; 0 takes the global value."),
    ),
    "query_timeout": KeyDoc(
        "seconds", "`query_timeout`", ("This user's `query_timeout`; 0 turns it off for the user.")
    ),
    "query_wait_timeout": KeyDoc(
        "seconds", "the database's", ("This user's `query_wait_timeout`, before the database's.")
    ),
    "transaction_timeout": KeyDoc(
        "seconds",
        "`transaction_timeout`",
        ("This user's `transaction_timeout`; 0 turns it off for the user."),
    ),
    "idle_transaction_timeout": KeyDoc(
        "seconds",
        "`idle_transaction_timeout`",
        ("This user's `idle_transaction_timeout`; 0 turns it off for the user."),
    ),
    "client_idle_timeout": KeyDoc(
        "seconds",
        "`client_idle_timeout`",
        ("This user's `client_idle_timeout`; 0 turns it off for the user."),
    ),
}

PEER_KEYS: dict[str, KeyDoc] = {
    "host": KeyDoc(
        "text",
        "unix socket in `unix_socket_dir`",
        (
            "Where the peer listens: a host name or address, or a unix socket directory (starting "
            "with `/`)."
        ),
    ),
    "port": KeyDoc("integer", "6432", "The peer's port."),
    "pool_size": KeyDoc(
        "integer",
        "`default_pool_size`",
        (
            "How many cancel requests may be in flight to the peer at once; the others wait, "
            "within `cancel_wait_timeout`."
        ),
    ),
}
