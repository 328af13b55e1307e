"""The admin console's SET walks every setting SHOW CONFIG marks changeable: each takes effect
as RELOAD with that value in the file would make it (the same code puts it in force)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support import PgtarnProcess, TempCluster

from .certs import Pki
from .conftest import PgtarnFactory
from .drivers import aconnect, connect
from .pgstat import wait_until
from .test_admin import Waiter, admin, show

pytestmark = pytest.mark.integration

#: pool_size 1 on the app database: a second client waits, and two clients share a server.
ONE_SERVER = "prep"


class Walk:
    """One pgtarn, its admin console, and the settings a check SET (restored after it)."""

    def __init__(self, proc: PgtarnProcess, pki: Pki, tmp: Path) -> None:
        self.proc = proc
        self.pki = pki
        self.tmp = tmp
        self.console = admin(proc)
        self.changed: list[tuple[str, str]] = []  # (name, value before), in SET order

    def shown(self, name: str) -> str:
        rows = [r for r in show(self.console, "CONFIG") if r["key"] == name]
        assert len(rows) == 1, name
        return str(rows[0]["value"])

    def set(self, name: str, value: str) -> None:
        """SET name = value; SHOW CONFIG then reports value."""
        before = self.shown(name)
        quoted = value.replace("'", "''")
        cur = self.console.execute(f"SET {name} = '{quoted}'")
        tag = cur.statusmessage or ""
        # the command tag is cut short as PgBouncer's (a long path)
        assert tag.startswith(f"SET {name}=") and f"SET {name}={value}".startswith(tag)
        assert self.shown(name) == value, name
        self.changed.append((name, before))

    def restore(self) -> None:
        """SET back what the last check changed, from a new console session (a timeout
        under test may have closed the old one)."""
        self.console.close()
        self.console = admin(self.proc)
        for name, value in reversed(self.changed):
            quoted = value.replace("'", "''")
            self.console.execute(f"SET {name} = '{quoted}'")
            assert self.shown(name) == value, name
        self.changed.clear()

    def log_count(self, phrase: str) -> int:
        return self.proc.log_text().count(phrase)

    def servers(self, database: str = "app") -> list[dict[str, Any]]:
        return [r for r in show(self.console, "SERVERS") if r["database"] == database]

    def database(self, name: str = "app") -> dict[str, Any]:
        return {r["name"]: r for r in show(self.console, "DATABASES")}[name]


def refused(proc: PgtarnProcess, user: str = "app", password: str = "app_pass", **kw: Any) -> str:
    with pytest.raises(psycopg.OperationalError) as info:
        connect(proc, user, password, **kw).close()
    return str(info.value)


def fails(conn: psycopg.Connection[Any], query: str) -> str:
    with pytest.raises(psycopg.Error) as info:
        conn.execute(query)
    return str(info.value)


# --- checks by effect: each SETs its setting (and any it needs) and shows what it does -------


def check_server_tls_sslmode(w: Walk) -> None:
    # the test cluster has no TLS: "disable" must not even ask for it
    w.set("server_tls_sslmode", "disable")
    with connect(w.proc, autocommit=True) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
    assert w.servers() and all(r["tls"] == "" for r in w.servers())


def check_server_tls_certificate(w: Walk) -> None:
    # a key and its certificate are loaded together: set while TLS towards PostgreSQL is off
    w.set("server_tls_sslmode", "disable")
    w.set("server_tls_key_file", w.pki.clients["app"].key)
    w.set("server_tls_cert_file", w.pki.clients["app"].cert)
    w.set("server_tls_sslmode", "prefer")
    # the files are read at SET, as at RELOAD: another user's key does not go with it; as
    # PgBouncer, the SET is taken (its certificate may be SET next) and the TLS in force stays
    before = w.log_count("TLS setup failed")
    w.set("server_tls_key_file", w.pki.clients["scram_user"].key)
    assert w.log_count("TLS setup failed") > before
    with connect(w.proc, autocommit=True) as conn:
        assert conn.execute("select 1").fetchone() == (1,)


def check_max_prepared_statements(w: Walk) -> None:
    with connect(w.proc, dbname=ONE_SERVER, autocommit=True) as conn:
        for n in range(3):
            conn.execute(f"select {n}", prepare=True)
        [server] = w.servers(ONE_SERVER)
        assert server["prepared_statements"] == 3
        w.set("max_prepared_statements", "1")
        conn.execute("select 42", prepare=True)
        [server] = w.servers(ONE_SERVER)
        assert server["prepared_statements"] == 1
        # PostgreSQL's own count on that (only) server
        assert conn.execute("select count(*) from pg_prepared_statements").fetchone() == (1,)


def check_client_tls(w: Walk) -> None:
    w.set("client_tls_key_file", w.pki.server.key)
    w.set("client_tls_cert_file", w.pki.server.cert)
    w.set("client_tls_ca_file", w.pki.ca)
    w.set("client_tls_sslmode", "require")
    with connect(w.proc, sslmode="require") as conn:
        assert conn.pgconn.ssl_in_use
    refused(w.proc, sslmode="disable")  # plaintext over TCP: no longer accepted


def check_default_pool_size(w: Walk) -> None:
    w.set("default_pool_size", "3")
    assert w.database()["pool_size"] == 3


def check_reserve_pool_size(w: Walk) -> None:
    w.set("reserve_pool_size", "2")
    assert w.database()["reserve_pool_size"] == 2


def check_min_pool_size(w: Walk) -> None:
    with connect(w.proc, autocommit=True) as conn:
        conn.execute("select 1")  # the app/app pool exists
    w.set("min_pool_size", "4")
    assert w.database()["min_pool_size"] == 4
    wait_until(lambda: len(w.servers()) >= 4, what="min_pool_size servers opened")


def check_max_db_connections(w: Walk) -> None:
    w.set("max_db_connections", "7")
    assert w.database()["max_connections"] == 7


def check_max_db_client_connections(w: Walk) -> None:
    # shown where PgBouncer shows it (the refused login is issue #19's point 8)
    w.set("max_db_client_connections", "1")
    assert w.database()["max_client_connections"] == 1


def check_max_user_client_connections(w: Walk) -> None:
    connect(w.proc, "scram_user", "scram_pass").close()  # scram_user has a pool
    w.set("max_user_client_connections", "1")
    users = {r["name"]: r for r in show(w.console, "USERS")}
    assert users["scram_user"]["max_user_client_connections"] == 1


def check_max_user_connections(w: Walk) -> None:
    w.set("max_user_connections", "1")
    users = {r["name"]: r for r in show(w.console, "USERS")}
    assert users["app"]["max_user_connections"] == 1


def check_max_client_conn(w: Walk) -> None:
    with connect(w.proc):
        w.set("max_client_conn", "1")
        assert "max_client_conn" in refused(w.proc)


def check_pool_mode(w: Walk) -> None:
    w.set("pool_mode", "session")
    with connect(w.proc, autocommit=True) as conn:
        conn.execute("select 1")
    pools = [r for r in show(w.console, "POOLS") if r["database"] == "app"]
    assert pools and all(r["pool_mode"] == "session" for r in pools)


def check_query_timeout(w: Walk) -> None:
    w.set("query_timeout", "0.5")
    with connect(w.proc, autocommit=True) as conn:
        started = time.monotonic()
        fails(conn, "select pg_sleep(5)")
        assert time.monotonic() - started < 3


def check_idle_transaction_timeout(w: Walk) -> None:
    w.set("idle_transaction_timeout", "0.5")
    with connect(w.proc) as conn:
        conn.execute("select 1")  # a transaction is open
        time.sleep(1.5)
        fails(conn, "select 1")


def check_transaction_timeout(w: Walk) -> None:
    w.set("transaction_timeout", "0.5")
    with connect(w.proc) as conn:
        conn.execute("select 1")
        time.sleep(1.5)
        fails(conn, "select 1")


def check_client_idle_timeout(w: Walk) -> None:
    w.set("client_idle_timeout", "0.5")
    with connect(w.proc, autocommit=True) as conn:
        time.sleep(1.5)
        fails(conn, "select 1")


def check_client_login_timeout(w: Walk) -> None:
    w.set("client_login_timeout", "0.5")
    with socket.create_connection((w.proc.host, w.proc.port), timeout=5) as sock:
        received = b""
        while chunk := sock.recv(1000):  # until pgtarn closes it, though nothing was sent
            received += chunk
    assert received.startswith(b"E") and b"client_login_timeout" in received


def check_query_wait_timeout(w: Walk) -> None:
    w.set("query_wait_timeout", "0.5")
    with connect(w.proc, dbname=ONE_SERVER) as holder:
        holder.execute("select 1")  # holds the only server
        with connect(w.proc, dbname=ONE_SERVER, autocommit=True) as waiter:
            started = time.monotonic()
            assert "query_wait_timeout" in fails(waiter, "select 1")
            assert time.monotonic() - started < 3


def check_query_wait_notify(w: Walk) -> None:
    w.set("query_wait_notify", "1")
    with connect(w.proc, dbname=ONE_SERVER) as holder:
        holder.execute("select 1")
        waiter = Waiter(_Db(w.proc, ONE_SERVER), "select 1")
        waiter.start()
        wait_until(lambda: bool(waiter.notices), timeout=4, what="the query_wait_notify NOTICE")
        holder.rollback()
    waiter.join(5)
    waiter.conn.close()
    assert waiter.error is None


class _Db:
    """A pgtarn process seen as if its DSNs named another database (for Waiter)."""

    def __init__(self, proc: PgtarnProcess, dbname: str) -> None:
        self.proc, self.dbname = proc, dbname

    def dsn(self, user: str, password: str | None, dbname: str = "app", **extra: object) -> str:
        return str(self.proc.dsn(user, password, dbname=self.dbname, **extra))


def check_server_idle_timeout(w: Walk) -> None:
    with connect(w.proc, autocommit=True) as conn:
        conn.execute("select 1")
    assert w.servers()
    w.set("server_idle_timeout", "0.5")
    wait_until(lambda: not w.servers(), timeout=5, what="idle servers closed")


def check_server_lifetime(w: Walk) -> None:
    with connect(w.proc, autocommit=True) as conn:
        conn.execute("select 1")
    assert w.servers()
    w.set("server_lifetime", "0.5")
    wait_until(lambda: not w.servers(), timeout=5, what="servers past their lifetime closed")


def check_log_connections(w: Walk) -> None:
    w.set("log_connections", "0")
    before = w.log_count("login attempt")
    connect(w.proc).close()
    assert w.log_count("login attempt") == before


def check_log_disconnections(w: Walk) -> None:
    w.set("log_disconnections", "0")
    connect(w.proc).close()
    time.sleep(0.2)
    before = w.log_count("closing because")
    connect(w.proc).close()
    time.sleep(0.2)
    assert w.log_count("closing because") == before


def check_log_pooler_errors(w: Walk) -> None:
    w.set("log_pooler_errors", "0")
    before = w.log_count("pooler error")
    refused(w.proc, password="wrong")
    assert w.log_count("pooler error") == before


def check_log_format(w: Walk) -> None:
    w.set("log_format", "json")
    connect(w.proc).close()
    last = [line for line in w.proc.log_text().splitlines() if line.strip()][-1]
    assert json.loads(last)["pid"]


def check_logfile(w: Walk) -> None:
    other = w.tmp / "other.log"
    w.set("logfile", str(other))
    connect(w.proc).close()
    wait_until(
        lambda: other.exists() and "login attempt" in other.read_text(),
        what="log lines in the new logfile",
    )


def check_stats(w: Walk) -> None:
    # pgtarn started with stats_period = 2; the period under way ends first
    w.set("stats_period", "1")
    wait_until(lambda: w.log_count("stats:") > 0, timeout=5, what="a stats line")
    first = w.log_count("stats:")
    wait_until(lambda: w.log_count("stats:") > first, timeout=3, what="the next stats line")
    started, count = time.monotonic(), w.log_count("stats:")
    wait_until(lambda: w.log_count("stats:") > count, timeout=3, what="a 1 s period")
    assert time.monotonic() - started < 1.6
    w.set("log_stats", "0")
    time.sleep(1.2)  # a period under way may still log
    count = w.log_count("stats:")
    time.sleep(2.2)
    assert w.log_count("stats:") == count


def check_admin_users(w: Walk) -> None:
    w.set("admin_users", "app,scram_user")
    with admin(w.proc, "scram_user", "scram_pass") as console:
        with pytest.raises(psycopg.errors.ProtocolViolation, match="not paused"):
            console.execute("RESUME")


def check_stats_users(w: Walk) -> None:
    w.set("stats_users", "md5_user")
    with admin(w.proc, "md5_user", "md5_pass") as console:
        assert show(console, "POOLS")


def check_auth_type(w: Walk) -> None:
    w.set("auth_type", "trust")
    with connect(w.proc, password="wrong") as conn:
        assert conn.execute("select current_user").fetchone() == ("app",)


def check_auth_file(w: Walk) -> None:
    userlist = w.tmp / "only-app.txt"
    userlist.write_text('"app" "app_pass"\n"md5_user" "md5_pass"\n', encoding="utf-8")
    w.set("auth_file", str(userlist))
    connect(w.proc).close()
    refused(w.proc, "scram_user", "scram_pass")


def check_auth_hba_file(w: Walk) -> None:
    hba = w.tmp / "hba.conf"
    hba.write_text(
        "host all scram_user 0.0.0.0/0 reject\nhost all all 0.0.0.0/0 scram-sha-256\n",
        encoding="utf-8",
    )
    w.set("auth_hba_file", str(hba))
    w.set("auth_type", "hba")
    connect(w.proc).close()
    refused(w.proc, "scram_user", "scram_pass")


def check_ignore_startup_parameters(w: Walk) -> None:
    # an untracked startup parameter is a session setting in transaction mode; ignored, it
    # is dropped (the server's own value shows)
    async def geqo() -> str:
        conn = await aconnect(w.proc, server_settings={"geqo": "off"})
        try:
            return str(await conn.fetchval("show geqo"))
        finally:
            await conn.close()

    assert asyncio.run(geqo()) == "off"
    w.set("ignore_startup_parameters", "geqo")
    assert asyncio.run(geqo()) == "on"


def check_max_packet_size(w: Walk) -> None:
    w.set("max_packet_size", "10000")
    with connect(w.proc, autocommit=True) as conn:
        fails(conn, "select '" + "x" * 20000 + "'")


def check_client_message_buffer(w: Walk) -> None:
    # a text longer than the buffer (and than one read) goes on in pieces, unparsed: its SET
    # pins the client
    # (read whole under the default buffer, the same SET is followed and the client pooled)
    text = "select '" + "x" * 200_000 + "'; set search_path = walk_marker"
    w.set("client_message_buffer", "16384")
    with connect(w.proc, autocommit=True) as conn:
        conn.execute(text)
        port = conn.execute("select inet_client_port()").fetchone()
        assert conn.execute("show search_path").fetchone() == ("walk_marker",)
        pins = [r["pinned"] for r in show(w.console, "CLIENTS") if r["database"] == "app"]
        assert "untracked" in pins, (pins, port)  # (a SET read whole is followed: no pin)


def check_pin_session_state(w: Walk) -> None:
    w.set("pin_session_state", "0")
    with connect(w.proc, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.FeatureNotSupported):
            conn.execute("set role app")


def check_track_session_state(w: Walk) -> None:
    w.set("track_session_state", "0")
    # one server for both clients: without tracking, one client's SET shows in the other
    with connect(w.proc, dbname=ONE_SERVER, autocommit=True) as first:
        first.execute("set search_path = walk_marker")
        with connect(w.proc, dbname=ONE_SERVER, autocommit=True) as second:
            assert second.execute("show search_path").fetchone() == ("walk_marker",)
        first.execute("reset search_path")


#: Settings checked by their effect -> the check (some checks SET a few settings together).
BY_EFFECT: dict[str, Callable[[Walk], None]] = {
    "server_tls_sslmode": check_server_tls_sslmode,
    "server_tls_key_file": check_server_tls_certificate,
    "server_tls_cert_file": check_server_tls_certificate,
    "max_prepared_statements": check_max_prepared_statements,
    "client_tls_sslmode": check_client_tls,
    "client_tls_key_file": check_client_tls,
    "client_tls_cert_file": check_client_tls,
    "client_tls_ca_file": check_client_tls,
    "default_pool_size": check_default_pool_size,
    "reserve_pool_size": check_reserve_pool_size,
    "min_pool_size": check_min_pool_size,
    "max_db_connections": check_max_db_connections,
    "max_db_client_connections": check_max_db_client_connections,
    "max_user_client_connections": check_max_user_client_connections,
    "max_user_connections": check_max_user_connections,
    "max_client_conn": check_max_client_conn,
    "pool_mode": check_pool_mode,
    "query_timeout": check_query_timeout,
    "idle_transaction_timeout": check_idle_transaction_timeout,
    "transaction_timeout": check_transaction_timeout,
    "client_idle_timeout": check_client_idle_timeout,
    "client_login_timeout": check_client_login_timeout,
    "query_wait_timeout": check_query_wait_timeout,
    "query_wait_notify": check_query_wait_notify,
    "server_idle_timeout": check_server_idle_timeout,
    "server_lifetime": check_server_lifetime,
    "log_connections": check_log_connections,
    "log_disconnections": check_log_disconnections,
    "log_pooler_errors": check_log_pooler_errors,
    "log_format": check_log_format,
    "logfile": check_logfile,
    "stats_period": check_stats,
    "log_stats": check_stats,
    "admin_users": check_admin_users,
    "stats_users": check_stats_users,
    "auth_type": check_auth_type,
    "auth_file": check_auth_file,
    "auth_hba_file": check_auth_hba_file,
    "ignore_startup_parameters": check_ignore_startup_parameters,
    "max_packet_size": check_max_packet_size,
    "client_message_buffer": check_client_message_buffer,
    "pin_session_state": check_pin_session_state,
    "track_session_state": check_track_session_state,
}

#: Settings checked only by SHOW CONFIG reporting the value SET (a valid non-default one):
#: their effect needs what a short test does not have, or a wait far past a minute.
#: "{pki...}" stands for a file of the test PKI.
BY_SHOW_CONFIG: dict[str, str] = {
    # TLS towards PostgreSQL: the test cluster has none (test_tls covers them on RELOAD,
    # which runs the same code as SET)
    "server_tls_ca_file": "{pki.ca}",
    "server_tls_protocols": "tlsv1.3",
    "server_tls_ciphers": "secure",
    "server_tls13_ciphers": "TLS_AES_256_GCM_SHA384",
    "server_channel_binding": "disable",
    # client TLS details: the handshake above uses the defaults
    "client_tls_protocols": "tlsv1.2,tlsv1.3",
    "client_tls_ciphers": "secure",
    "client_tls13_ciphers": "TLS_AES_256_GCM_SHA384",
    "client_tls_ecdhcurve": "prime256v1",
    "client_tls_dheparams": "none",
    # auth_query needs a role that may read pg_authid (test_auth_query); LDAP and ident
    # maps need what the test cluster has not
    "auth_user": "postgres",
    "auth_query": "SELECT usename, passwd FROM pg_shadow WHERE usename=$1",
    "auth_dbname": "app",
    "auth_ldap_options": "host=ldap.invalid",
    # the PAM and LDAP check threads (test_pam.py and test_ldap.py log in through them)
    "auth_threads": "2",
    "auth_queue_size": "7",
    "auth_pam_service": "pgtarn-test",
    "auth_ident_file": "/dev/null",  # an empty map file
    "scram_iterations": "8192",  # used when a plaintext auth_file password is hashed
    # waits and retries that take seconds to minutes to show
    "autodb_idle_timeout": "1800",
    "cancel_wait_timeout": "20",
    "suspend_timeout": "20",
    "reserve_pool_timeout": "3",
    "server_connect_timeout": "20",
    "server_login_retry": "20",
    "server_check_delay": "60",
    "server_check_query": "select 1",
    "server_reset_query": "DISCARD PLANS",  # session mode only
    "server_reset_query_always": "1",
    "server_round_robin": "1",
    "server_fast_close": "1",
    "listen_queue_size": "500",
    # effects shown by test_parity.py (a NOTICE at a raw login; a pool dropped after a wait)
    "login_notify_message": "walked",
    "pool_idle_timeout": "30",
    "dns_max_ttl": "30",
    "dns_nxdomain_ttl": "30",
    "dns_zone_check_period": "60",
    # logging destinations and levels with nothing to look at here
    "verbose": "1",
    "syslog": "1",
    "syslog_ident": "walk",
    "syslog_facility": "local0",
    # socket tuning, not observable from a client (test_reload.py reads tcp_keepalive and
    # tcp_keepidle on pgtarn's side of real connections with ss)
    "sbuf_loopcnt": "10",
    "tcp_defer_accept": "0",
    "tcp_keepalive": "0",
    "tcp_keepcnt": "5",
    "tcp_keepidle": "30",
    "tcp_keepintvl": "10",
    "tcp_socket_buffer": "65536",
    "tcp_user_timeout": "5000",
    # read by no code of pgtarn yet (PgBouncer appends the client's address to
    # application_name): only accepted and shown
    "application_name_add_host": "1",
    # conffile is informational (peer_id changes only at restart: test_peers.py)
    "conffile": "/etc/pgbouncer/other.ini",
}


def test_set_of_every_changeable_setting_takes_effect(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster, pki: Pki, tmp_path: Path
) -> None:
    base = f"host={pg_cluster.host} port={pg_cluster.port} dbname=app"
    proc = pgtarn_factory(
        databases={"app": base, ONE_SERVER: f"{base} pool_size=1"},
        settings={"stats_period": 2},
    )
    walk = Walk(proc, pki, tmp_path)
    changeable = [r["key"] for r in show(walk.console, "CONFIG") if r["changeable"] == "yes"]
    assert not set(BY_EFFECT) & set(BY_SHOW_CONFIG)
    unchecked = set(changeable) - set(BY_EFFECT) - set(BY_SHOW_CONFIG)
    assert not unchecked, f"changeable settings this test does not check: {sorted(unchecked)}"
    stale = (set(BY_EFFECT) | set(BY_SHOW_CONFIG)) - set(changeable)
    assert not stale, f"settings listed here that are not changeable: {sorted(stale)}"
    set_by: dict[Callable[[Walk], None], set[str]] = {}
    try:
        walk_all(walk, changeable, set_by, pki)
    finally:
        walk.console.close()


def walk_all(
    walk: Walk, changeable: list[str], set_by: dict[Callable[[Walk], None], set[str]], pki: Pki
) -> None:
    for name in changeable:
        check = BY_EFFECT.get(name)
        if check is None:
            walk.set(name, BY_SHOW_CONFIG[name].format(pki=pki))
        elif check not in set_by:
            check(walk)
            set_by[check] = {n for n, _ in walk.changed}
        assert check is None or name in set_by[check], f"{check.__name__} does not SET {name}"
        walk.restore()
