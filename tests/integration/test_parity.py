"""PgBouncer parity: client limits per database and user, connect_query, login_notify_message,
server_fast_close, pool_idle_timeout, auth_user with trust, SHOW SOCKETS/PEERS, log phrases."""

from __future__ import annotations

import re
import time
from typing import Any

import psycopg
import pytest

from pgtarn.proto import build
from tests.support import PgtarnProcess, TempCluster

from . import test_auth_query
from .conftest import PgtarnFactory
from .drivers import connect
from .pgstat import wait_until
from .rawpg import RawClient, error_fields
from .test_admin import admin, show
from .test_auth import login_error
from .test_auth_query import AUTH_PASSWORD, AUTH_USER
from .test_listen import RawSession

pytestmark = pytest.mark.integration

auth_role = test_auth_query.auth_role  # the fixture


def _refusal(
    proc: PgtarnProcess, user: str = "app", password: str = "app_pass", dbname: str = "app"
) -> psycopg.OperationalError:
    with pytest.raises(psycopg.OperationalError) as info:
        connect(proc, user, password, dbname=dbname)
    return info.value


def _client_count(console: psycopg.Connection[Any], database: str) -> int:
    rows = [r for r in show(console, "DATABASES") if r["name"] == database]
    return int(rows[0]["current_client_connections"])


def test_client_limits_per_database_and_user(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    base = f"host={pg_cluster.host} port={pg_cluster.port}"
    proc = pgtarn_factory(
        databases={
            "app": f"{base} dbname=app max_db_client_connections=2",
            "other": f"{base} dbname=app",
            "db2": f"{base} dbname=app",
            "db3": f"{base} dbname=app",
        },
        settings={"max_db_client_connections": 3, "max_user_client_connections": 4},
        users={"md5_user": "max_user_client_connections=1"},
    )
    scram = ("scram_user", "scram_pass")
    held = [connect(proc, *scram), connect(proc, *scram)]
    assert login_error(proc, *scram) == (
        "53300",
        "client connections exceeded (max_db_client_connections)",
    )
    # admin_users get past the limit of the admin console only, as in PgBouncer
    assert login_error(proc, "app", "app_pass")[1] == (
        "client connections exceeded (max_db_client_connections)"
    )
    with admin(proc) as console:
        rows = {r["name"]: r for r in show(console, "DATABASES")}
        assert (
            rows["app"]["max_client_connections"],
            rows["app"]["current_client_connections"],
        ) == (2, 2)
        assert rows["other"]["max_client_connections"] == 3
        users = {r["name"]: r for r in show(console, "USERS")}
        assert users["md5_user"]["max_user_client_connections"] == 1
        assert (
            users["scram_user"]["max_user_client_connections"],
            users["scram_user"]["current_client_connections"],
        ) == (4, 2)
    held.pop(0).close()
    with admin(proc) as console:
        wait_until(lambda: _client_count(console, "app") == 1, what="the clients gone")
    held.append(connect(proc, *scram))  # room again
    # the global per-database limit, for a database with none of its own
    others = [connect(proc, "password_user", "password_pass", dbname="other") for _ in range(3)]
    assert "(max_db_client_connections)" in str(
        _refusal(proc, "password_user", "password_pass", dbname="other")
    )
    # per user, across databases: the [users] entry, then the global one
    held.append(connect(proc, "md5_user", "md5_pass", dbname="db2"))
    assert login_error(proc, "md5_user", "md5_pass", dbname="db3") == (
        "53300",
        "client connections exceeded (max_user_client_connections)",
    )
    held += [connect(proc, *scram, dbname="db2"), connect(proc, *scram, dbname="db2")]
    assert "(max_user_client_connections)" in str(_refusal(proc, *scram, dbname="db3"))
    assert "client connections exceeded" in proc.log_text()
    for c in held + others:
        c.close()


def test_admin_console_counts_against_the_client_limits(pgtarn_factory: PgtarnFactory) -> None:
    """As PgBouncer: the admin console is a database with the global
    max_db_client_connections, its sessions count for their user too; only admin_users get
    past either limit there."""
    proc = pgtarn_factory(
        settings={"max_db_client_connections": 2, "stats_users": "scram_user,md5_user"}
    )
    with admin(proc, "scram_user", "scram_pass"), admin(proc, "scram_user", "scram_pass"):
        with pytest.raises(
            psycopg.OperationalError,
            match=r"client connections exceeded \(max_db_client_connections\)",
        ):
            admin(proc, "md5_user", "md5_pass").close()
        with admin(proc) as console:  # app is in admin_users
            rows = {r["name"]: r for r in show(console, "DATABASES")}
            assert (
                rows["pgbouncer"]["max_client_connections"],
                rows["pgbouncer"]["current_client_connections"],
            ) == (2, 3)
    proc = pgtarn_factory(settings={"max_user_client_connections": 1, "stats_users": "scram_user"})
    with connect(proc, "scram_user", "scram_pass"):
        with pytest.raises(psycopg.OperationalError, match=r"\(max_user_client_connections\)"):
            admin(proc, "scram_user", "scram_pass").close()
    with admin(proc, "scram_user", "scram_pass"):
        assert login_error(proc, "scram_user", "scram_pass")[1] == (
            "client connections exceeded (max_user_client_connections)"
        )
        with admin(proc) as one, admin(proc) as two:  # admin_users: past the limit
            assert show(one, "VERSION") and show(two, "VERSION")


def test_show_sockets_and_show_peers(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory()
    with (
        connect(proc, "scram_user", "scram_pass", autocommit=True) as client,
        admin(proc) as console,
    ):
        client.execute("select 1")
        sockets = show(console, "SOCKETS")
        clients = {r["user"]: r for r in sockets if r["type"] == "C"}
        assert clients["scram_user"]["database"] == "app"
        assert clients["app"]["database"] == "pgbouncer"  # the console's own connection
        servers = [r for r in sockets if r["type"] == "S"]
        assert [(r["user"], r["database"], r["state"]) for r in servers] == [
            ("scram_user", "app", "idle")
        ]
        assert all(r["send_remain"] == 0 and r["pkt_avail"] == 0 for r in sockets)
        assert show(console, "ACTIVE_SOCKETS") == []  # nothing under way
        assert show(console, "PEERS") == []


def test_connect_query_runs_once_on_each_new_server(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    base = f"host={pg_cluster.host} port={pg_cluster.port} dbname=app"
    proc = pgtarn_factory(
        databases={
            "app": f"{base} connect_query='select set_config(''pgtarn.cq'', ''ran'', false)'",
            "bad": f"{base} connect_query='select * from no_such_table'",
        }
    )
    with connect(proc, "scram_user", "scram_pass", autocommit=True) as c:
        assert c.execute("select current_setting('pgtarn.cq', true)").fetchone() == ("ran",)
    with pytest.raises(psycopg.OperationalError) as info:
        connect(proc, "scram_user", "scram_pass", dbname="bad")
    assert "connect_query failed" in str(info.value)
    assert 'relation "no_such_table" does not exist' in str(info.value)
    lines = proc.log_text().splitlines()
    failed = next(x for x in lines if "S-" in x and "closing because: connect_query failed" in x)
    match = re.search(r" (S-\d+: )", failed)
    assert match is not None, failed
    server = match.group(1)  # "S-7: "
    assert [x for x in lines if server in x and "new connection to server" in x] == []
    assert any("new connection to server" in x for x in lines)  # the good one


def test_login_notify_message_is_a_notice_at_login(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(
        settings={"auth_type": "trust", "login_notify_message": "maintenance at 22:00 UTC"}
    )
    raw = RawClient(proc.host, proc.port)
    try:
        raw.startup(user="scram_user", database="app")
        messages = raw.read_until("Z")
    finally:
        raw.close()
    types = [t for t, _ in messages]
    assert types[0] == "R" and types[-1] == "Z"
    notices = [error_fields(body) for t, body in messages if t == "N"]
    assert notices == [
        {"S": "NOTICE", "V": "NOTICE", "C": "00000", "M": "maintenance at 22:00 UTC"}
    ]
    assert types.index("N") == len(types) - 2  # after the welcome's parameters and key
    with connect(proc, "scram_user", None, autocommit=True) as c:  # drivers are fine with it
        assert c.execute("select 1").fetchone() == (1,)


def test_auth_user_with_trust_and_no_auth_file_entry(
    pgtarn_factory: PgtarnFactory, auth_role: str
) -> None:
    """auth_type = trust: a user auth_file does not name is looked up with auth_query; one
    PostgreSQL knows logs in without a password (its md5 secret logs in to the server), one
    it does not know is "no such user"."""
    proc = pgtarn_factory(
        settings={
            "auth_type": "trust",
            "auth_user": auth_role,
            "max_user_client_connections": 1,
            "stats_users": auth_role,
        },
        userlist={AUTH_USER: AUTH_PASSWORD},
    )
    with connect(proc, "md5_user", None, autocommit=True) as c:
        assert c.execute("select current_user").fetchone() == ("md5_user",)
        # a user found by auth_query has the client limit too, and a SHOW USERS row
        assert login_error(proc, "md5_user", None)[1] == (
            "client connections exceeded (max_user_client_connections)"
        )
        with admin(proc, AUTH_USER, AUTH_PASSWORD) as console:
            users = {r["name"]: r for r in show(console, "USERS")}
        assert (
            users["md5_user"]["max_user_client_connections"],
            users["md5_user"]["current_client_connections"],
        ) == (1, 1)
    sqlstate, message = login_error(proc, "nobody_here", None)
    # PgBouncer's wording for a login that auth_query finds no user for
    assert (sqlstate, message) == ("28000", "no such user")


def test_log_phrases_and_pool_idle_timeout(pgtarn_factory: PgtarnFactory) -> None:
    """PgBouncer's key phrases in the log; pool_idle_timeout drops pools left with nothing."""
    proc = pgtarn_factory(
        settings={
            "default_pool_size": 1,
            "reserve_pool_size": 1,
            "reserve_pool_timeout": 0.2,
            "server_idle_timeout": 0.3,
            "pool_idle_timeout": 0.5,
        }
    )
    with (
        connect(proc, "scram_user", "scram_pass") as holder,
        connect(proc, "scram_user", "scram_pass", autocommit=True) as waiter,
    ):
        holder.execute("select 1")  # in a transaction: holds the pool's one server
        assert waiter.execute("select 2").fetchone() == (2,)  # from the reserve, 0.2 s later
        holder.rollback()
    with connect(proc, "scram_user", "scram_pass", dbname="postgres", autocommit=True) as c:
        c.execute("select 1")  # "postgres" comes from the "*" entry
    with admin(proc) as console:
        wait_until(
            lambda: [r["database"] for r in show(console, "POOLS")] == ["pgbouncer"],
            what="the pools dropped",
        )  # the console's own row stays
    text = proc.log_text()
    for phrase in (
        "login attempt: db=app user=scram_user tls=no",
        "new connection to server",
        "taking connection from reserve_pool",
        "registered new auto-database: db=postgres",
        "closing because: server_idle_timeout",
        "closing because: client close request",
        "app/scram_user: cleaning up idle pool (pool_idle_timeout)",
        "postgres/scram_user: cleaning up idle pool (pool_idle_timeout)",
    ):
        assert phrase in text, phrase


def test_log_lines_name_connections_in_pgbouncers_layout(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    """Log readers parse PgBouncer's "C-id: database/user@host:port message" and
    "S-id: database/user@host:port message" (its load-balancing tests look for
    "127.0.0.1:<port> new connection to server")."""
    proc = pgtarn_factory()
    with connect(proc, autocommit=True) as conn:
        conn.execute("select 1")
    closed = (
        r" C-\d+: app/app@127\.0\.0\.1:\d+ closing because: client close request "
        r"\(age=\d+s\)"
    )
    wait_until(
        lambda: re.search(closed, proc.log_text()) is not None, what="the client's close logged"
    )
    text = proc.log_text()
    assert re.search(
        r" S-\d+: app/app@127\.0\.0\.1:(\d+) new connection to server \(from ", text
    ), text
    assert re.search(r" C-\d+: app/app@127\.0\.0\.1:\d+ login attempt: db=app user=app ", text), (
        text
    )


def test_server_fast_close_ends_sessions_at_their_transactions_end(
    pgtarn_factory: PgtarnFactory,
) -> None:
    """Session mode, RECONNECT: with server_fast_close a session's server is closed as soon as
    its transaction has ended, not when the client leaves; its client is closed with it."""
    proc = pgtarn_factory(settings={"pool_mode": "session", "server_fast_close": 1})
    scram = ("scram_user", "scram_pass")
    with (
        connect(proc, *scram) as busy,
        connect(proc, *scram, autocommit=True) as idle,
        admin(proc) as console,
    ):
        busy.execute("select 1")  # a transaction under way
        idle.execute("select 1")
        console.execute("RECONNECT")
        time.sleep(0.5)  # a few janitor rounds
        with pytest.raises(psycopg.OperationalError, match="server_fast_close"):
            idle.execute("select 2")
        assert busy.execute("select 3").fetchone() == (3,)  # its transaction goes on
        busy.commit()
        time.sleep(0.5)
        with pytest.raises(psycopg.OperationalError, match="server_fast_close"):
            busy.execute("select 4")
        wait_until(lambda: not [r for r in show(console, "SERVERS")], what="servers closed")
    with connect(proc, *scram, autocommit=True) as fresh:  # new sessions get new servers
        assert fresh.execute("select 5").fetchone() == (5,)


def test_describe_of_an_unknown_statement_keeps_the_connection(
    pgtarn_factory: PgtarnFactory,
) -> None:
    """A Describe of a statement the client never prepared gets PostgreSQL's 26000 and the
    client goes on (PgBouncer closes the connection: pgtarn keeps the better behaviour)."""
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    raw = RawSession(proc)
    try:
        raw.send(build.message(b"D", b"Snever_prepared\x00") + build.SYNC)
        replies: list[tuple[str, bytes]] = []
        while not replies or replies[-1][0] != "Z":
            replies.append(raw.read_message())
        assert [kind for kind, _ in replies] == ["E", "Z"]
        assert b"C26000\x00" in replies[0][1]
        assert [kind for kind, _ in raw.query("select 1")] == ["T", "D", "C", "Z"]
    finally:
        raw.close()
