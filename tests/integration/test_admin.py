"""The admin console against a real pgtarn: SHOW tables checked against a known state,
permissions, control commands, psql and the unix-socket login."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgtarn.errors import PgtarnError
from pgtarn.proto import build
from pgtarn.proto.server_login import ServerAuth
from tests.support import PgtarnProcess, TempCluster

from .conftest import PgtarnFactory
from .drivers import DsnSource, connect, scalar
from .pgstat import wait_for, wait_until

TEXT, INT4, INT8, NUMERIC = 25, 23, 20, 1700


def _words(text: str) -> list[str]:
    return text.split()


SOCKET_COLUMNS = _words(
    "type user database replication state addr port local_addr local_port connect_time"
    " request_time wait wait_us close_needed ptr link remote_pid tls application_name"
    " prepared_statements id"
)
EXPECTED_COLUMNS: dict[str, list[str]] = {
    "POOLS": _words(
        "database user cl_active cl_waiting cl_active_cancel_req cl_waiting_cancel_req"
        " sv_active sv_active_cancel sv_being_canceled sv_idle sv_used sv_tested sv_login"
        " maxwait maxwait_us pool_mode load_balance_hosts"
    ),
    "CLIENTS": [*SOCKET_COLUMNS, "pinned", "tracked_settings"],
    # pgtarn's own columns after PgBouncer's: the role and lag of a split database's server
    "SERVERS": [*SOCKET_COLUMNS, "role", "lag"],
    "STATS": _words(
        "database total_server_assignment_count total_xact_count total_query_count"
        " total_received total_sent total_xact_time total_query_time total_wait_time"
        " total_client_parse_count total_server_parse_count total_bind_count"
        " total_client_login_count avg_server_assignment_count avg_xact_count avg_query_count"
        " avg_recv avg_sent avg_xact_time avg_query_time avg_wait_time avg_client_parse_count"
        " avg_server_parse_count avg_bind_count avg_client_login_count"
    ),
    "STATS_TOTALS": _words(
        "database server_assignment_count xact_count query_count bytes_received bytes_sent"
        " xact_time query_time wait_time client_parse_count server_parse_count bind_count"
        " client_login_count"
    ),
    "STATS_AVERAGES": _words(
        "database server_assignment_count xact_count query_count bytes_received bytes_sent"
        " xact_time query_time wait_time avg_client_parse_count avg_server_parse_count"
        " avg_bind_count avg_client_login_count"
    ),
    "TOTALS": ["name", "value"],
    "DATABASES": _words(
        "name host port database force_user pool_size min_pool_size reserve_pool_size"
        " server_lifetime pool_mode load_balance_hosts max_connections current_connections"
        " max_client_connections current_client_connections paused disabled"
    ),
    "USERS": _words(
        "name pool_size reserve_pool_size pool_mode max_user_connections current_connections"
        " max_user_client_connections current_client_connections"
    ),
    "CONFIG": ["key", "value", "default", "changeable"],
    "LISTS": ["list", "items"],
    "STATE": ["key", "value"],
    "VERSION": ["version"],
    "LISTENERS": ["database", "user", "channel", "clients"],  # pgtarn's own
    "SOCKETS": [
        *SOCKET_COLUMNS,
        *_words("recv_pos pkt_pos pkt_remain send_pos send_remain pkt_avail send_avail"),
    ],
    "PEERS": ["peer_id", "host", "port", "pool_size"],
    "MEM": ["name", "size", "used", "free", "memtotal"],
    "DNS_HOSTS": ["hostname", "ttl", "addrs"],
    "DNS_ZONES": ["zonename", "serial", "count"],
}
EXPECTED_COLUMNS["ACTIVE_SOCKETS"] = EXPECTED_COLUMNS["SOCKETS"]
#: Columns PgBouncer sends as int4 (the others of these tables are text).
INT_COLUMNS = {
    "POOLS": set(EXPECTED_COLUMNS["POOLS"][2:15]),
    "CLIENTS": {
        "port",
        "local_port",
        "wait",
        "wait_us",
        "close_needed",
        "remote_pid",
        "prepared_statements",
        "id",
    },
    "DATABASES": {
        "port",
        "pool_size",
        "min_pool_size",
        "reserve_pool_size",
        "server_lifetime",
        "max_connections",
        "current_connections",
        "max_client_connections",
        "current_client_connections",
        "paused",
        "disabled",
    },
    "USERS": {
        "max_user_connections",
        "current_connections",
        "max_user_client_connections",
        "current_client_connections",
    },
    "LISTS": {"items"},
    "LISTENERS": {"clients"},
}
INT_COLUMNS["SERVERS"] = INT_COLUMNS["CLIENTS"]
INT_COLUMNS["SOCKETS"] = INT_COLUMNS["ACTIVE_SOCKETS"] = INT_COLUMNS["CLIENTS"] | set(
    EXPECTED_COLUMNS["SOCKETS"][-7:]
)
INT_COLUMNS["PEERS"] = {"peer_id", "port", "pool_size"}
INT_COLUMNS["MEM"] = {"size", "used", "free", "memtotal"}
INT_COLUMNS["DNS_ZONES"] = {"count"}
#: Columns PgBouncer sends as int8.
INT8_COLUMNS = {("DNS_HOSTS", "ttl"), ("DNS_ZONES", "serial")}


def admin(
    proc: PgtarnProcess, user: str = "app", password: str | None = "app_pass", **kw: Any
) -> psycopg.Connection[Any]:
    return psycopg.connect(proc.dsn(user, password, dbname="pgbouncer"), autocommit=True, **kw)


async def login_error(proc: PgtarnProcess, user: str, password: str) -> str | None:
    """The SQLSTATE of the error that ends a login to the admin console (None: logged in)."""
    reader, writer = await asyncio.open_connection(proc.host, proc.port)
    try:
        login = ServerAuth(user, password)
        writer.write(build.startup_message({"user": user, "database": "pgbouncer"}))
        while not login.done:
            header = await reader.readexactly(5)
            body = await reader.readexactly(int.from_bytes(header[1:], "big") - 4)
            try:
                reply = login.feed(header[0], body)
            except PgtarnError as error:
                return error.sqlstate
            if reply:
                writer.write(reply)
        return None
    finally:
        writer.close()
        await writer.wait_closed()


def show(conn: psycopg.Connection[Any], what: str) -> list[dict[str, Any]]:
    cur = conn.execute(f"SHOW {what}")
    assert cur.description is not None
    names = [d.name for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def pool_row(
    conn: psycopg.Connection[Any], database: str = "app", user: str = "app"
) -> dict[str, Any]:
    rows = [r for r in show(conn, "POOLS") if (r["database"], r["user"]) == (database, user)]
    assert len(rows) == 1, rows
    return rows[0]


class Waiter(threading.Thread):
    """A client that runs one query in the background (it may have to wait for a server)."""

    def __init__(self, proc: DsnSource, query: str) -> None:
        super().__init__(daemon=True)
        self.conn = connect(proc, autocommit=True)
        self.query = query
        self.result: Any = None
        self.error: BaseException | None = None
        self.notices: list[str] = []
        self.conn.add_notice_handler(lambda d: self.notices.append(d.message_primary or ""))

    def run(self) -> None:
        try:
            self.result = self.conn.execute(self.query).fetchall()
        except BaseException as exc:  # reported by the test
            self.error = exc


def blocked_query(
    conn: psycopg.Connection[Any], query: str, wait: float = 0.5
) -> tuple[threading.Thread, list[Any]]:
    """Run query on conn in a thread; check it is still blocked after wait seconds."""
    result: list[Any] = []
    t = threading.Thread(target=lambda: result.append(conn.execute(query).fetchone()), daemon=True)
    t.start()
    t.join(wait)
    assert t.is_alive() and result == []
    return t, result


def test_every_show_has_pgbouncers_columns_and_types(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory()
    with connect(proc, autocommit=True) as c:
        c.execute("select 1")
    with admin(proc) as a:
        for what, names in EXPECTED_COLUMNS.items():
            cur = a.execute(f"SHOW {what}")
            assert cur.description is not None
            assert [d.name for d in cur.description] == names, what
            assert cur.statusmessage == "SHOW"
            types = {d.name: d.type_code for d in cur.description}
            for name, oid in types.items():
                if (
                    what.startswith("STATS")
                    or what == "TOTALS"
                    or (what, name) == ("SERVERS", "lag")
                ):
                    expected = TEXT if name in ("database", "name") else NUMERIC
                elif (what, name) in INT8_COLUMNS:
                    expected = INT8
                else:
                    expected = INT4 if name in INT_COLUMNS.get(what, set()) else TEXT
                assert oid == expected, (what, name, oid)
        # SELECT is an alias of SHOW, as in PgBouncer; lower case works
        assert scalar(a.execute("select version")).startswith("PgBouncer 1.")
        assert a.execute("show state").fetchall() == [
            ("active", "yes"),
            ("paused", "no"),
            ("suspended", "no"),
        ]


def test_show_tables_describe_a_known_state(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    """2 clients in transactions hold the 2 servers; a third client waits."""
    proc = pgtarn_factory(settings={"default_pool_size": 2, "query_wait_notify": 1})
    holders = [connect(proc) for _ in range(2)]
    waiter = None
    try:
        pids = {scalar(h.execute("select pg_backend_pid()")) for h in holders}
        assert len(pids) == 2
        waiter = Waiter(proc, "select 42")
        waiter.start()
        with admin(proc) as a:
            assert wait_for(lambda: pool_row(a)["cl_waiting"] == 1)
            time.sleep(1.3)  # > query_wait_notify
            pool = pool_row(a)
            assert (
                pool["cl_active"],
                pool["cl_waiting"],
                pool["sv_active"],
                pool["sv_idle"],
                pool["sv_used"],
                pool["sv_tested"],
                pool["sv_login"],
            ) == (2, 1, 2, 0, 0, 0, 0)
            assert pool["maxwait"] >= 1 and 0 <= pool["maxwait_us"] < 1_000_000
            assert pool["pool_mode"] == "transaction"
            admin_pool = pool_row(a, "pgbouncer", "pgbouncer")
            assert admin_pool["cl_active"] == 1

            clients = [r for r in show(a, "CLIENTS") if r["database"] == "app"]
            servers = show(a, "SERVERS")
            assert sorted(r["state"] for r in clients) == ["active", "active", "waiting"]
            assert sorted(r["state"] for r in servers) == ["active", "active"]
            assert {r["remote_pid"] for r in servers} == pids
            server_ptrs = {r["ptr"] for r in servers}
            assert {r["link"] for r in clients if r["state"] == "active"} == server_ptrs
            assert {r["link"] for r in servers} == {
                r["ptr"] for r in clients if r["state"] == "active"
            }
            waiting = next(r for r in clients if r["state"] == "waiting")
            assert waiting["link"] == "" and waiting["wait"] >= 1
            assert all(
                r["type"] == "C" and r["user"] == "app" and r["addr"] == "127.0.0.1"
                for r in clients
            )
            assert len({r["id"] for r in clients}) == 3

            dbs = {r["name"]: r for r in show(a, "DATABASES")}
            assert dbs["app"]["current_connections"] == 2
            assert dbs["app"]["current_client_connections"] == 3
            assert dbs["app"]["pool_size"] == 2 and dbs["app"]["port"] == pg_cluster.port
            assert dbs["app"]["paused"] == 0 and dbs["app"]["disabled"] == 0
            users = {r["name"]: r for r in show(a, "USERS")}
            assert users["app"]["current_connections"] == 2
            assert users["app"]["current_client_connections"] == 4  # and this admin session
            lists = dict(a.execute("SHOW LISTS").fetchall())
            assert lists["pools"] == 1 and lists["used_servers"] == 2
            assert lists["used_clients"] == 4  # 3 clients and this admin session

            for h in holders:
                h.commit()  # the waiting client gets a server
            waiter.join(10)
            assert waiter.error is None and waiter.result == [(42,)]
            assert len(waiter.notices) == 1 and "queued" in waiter.notices[0]

            stats = {r["database"]: r for r in show(a, "STATS")}["app"]
            # 2 transactions of the holders + the waiter's query
            assert stats["total_xact_count"] == 3
            # psycopg sends BEGIN and COMMIT as queries of their own: 2 x 3 + 1
            assert stats["total_query_count"] == 7
            assert stats["total_server_assignment_count"] == 3
            assert stats["total_wait_time"] >= 1_300_000  # the waiter's wait, microseconds
            assert stats["total_xact_time"] >= stats["total_query_time"] > 0
            assert stats["total_received"] > 0 and stats["total_sent"] > 0
            assert stats["total_client_login_count"] == 3
            console = {r["database"]: r for r in show(a, "STATS")}["pgbouncer"]
            totals = dict(a.execute("SHOW TOTALS").fetchall())
            # the app's 3 and, as PgBouncer counts, each console command (SHOW TOTALS too)
            assert totals["total_xact_count"] == 3 + console["total_xact_count"] + 1
    finally:
        for h in holders:
            h.close()
        if waiter is not None:
            waiter.conn.close()


def test_show_listeners_lists_the_channels_of_pooled_listeners(
    pgtarn_factory: PgtarnFactory,
) -> None:
    """Transaction mode: LISTEN answered by pgtarn; SHOW LISTENERS counts the clients."""
    proc = pgtarn_factory(settings={"default_pool_size": 1, "stats_users": "md5_user"})
    first = connect(proc, autocommit=True)
    second = connect(proc, autocommit=True)
    try:
        first.execute("LISTEN jobs")
        first.execute('LISTEN "Odd ""chan"""')
        second.execute("LISTEN jobs")
        with admin(proc, "md5_user", "md5_pass") as stats:  # a stats user may
            assert show(stats, "LISTENERS") == [
                {"database": "app", "user": "app", "channel": 'Odd "chan"', "clients": 1},
                {"database": "app", "user": "app", "channel": "jobs", "clients": 2},
            ]
            second.execute("UNLISTEN *")
            assert show(stats, "LISTENERS") == [
                {"database": "app", "user": "app", "channel": 'Odd "chan"', "clients": 1},
                {"database": "app", "user": "app", "channel": "jobs", "clients": 1},
            ]
            first.close()
            assert wait_for(lambda: show(stats, "LISTENERS") == [])
    finally:
        first.close()
        second.close()


def test_averages_and_the_log_stats_line(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"stats_period": 1})
    with connect(proc, autocommit=True) as c, admin(proc) as a:
        deadline = time.monotonic() + 3
        n = 0
        while time.monotonic() < deadline:
            c.execute("select 1")
            n += 1
        averages = {r["database"]: r for r in show(a, "STATS_AVERAGES")}["app"]
        assert 0 < averages["xact_count"] <= n  # per second, over the last whole period
        assert averages["query_count"] == averages["xact_count"]
        assert averages["xact_time"] > 0
    assert wait_for(lambda: "stats: " in proc.log_text())
    line = next(x for x in proc.log_text().splitlines() if "stats: " in x)
    assert "xacts/s" in line and "queries/s" in line and "wait" in line


def test_psql_and_the_unix_socket_login_of_the_os_user(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory()
    out = subprocess.run(
        [
            "psql",
            "-X",
            "-At",
            "-h",
            proc.socket_dir,
            "-p",
            str(proc.port),
            "-U",
            "pgbouncer",
            "-d",
            "pgbouncer",
            "-c",
            "SHOW VERSION",
            "-c",
            "SHOW HELP",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("PgBouncer 1.") and "pgtarn" in out.stdout
    assert "Console usage" in out.stderr and "SHOW HELP|CONFIG" in out.stderr
    # over TCP the same name needs a password it does not have
    with pytest.raises(psycopg.OperationalError, match="authentication failed"):
        admin(proc, "pgbouncer", "x")


def test_permissions(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"admin_users": "app", "stats_users": "md5_user"})
    with admin(proc, "md5_user", "md5_pass") as stats:
        assert show(stats, "POOLS") is not None
        for command in (
            "PAUSE",
            "RELOAD",
            "SET default_pool_size = 3",
            "KILL_CLIENT 1",
            "SHUTDOWN",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="admin access"):
                stats.execute(command)
        assert stats.execute("SHOW STATE").fetchall()[0] == ("active", "yes")
    with pytest.raises(psycopg.OperationalError, match="not allowed"):
        admin(proc, "scram_user", "scram_pass")
    for user, password, sqlstate in (
        ("scram_user", "scram_pass", "28000"),
        ("app", "wrong", "28P01"),
    ):
        assert asyncio.run(login_error(proc, user, password)) == sqlstate
    with admin(proc) as a:
        a.execute("SET default_pool_size = 3")  # the admin may


def test_errors_keep_the_session(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory()
    with admin(proc) as a:
        with pytest.raises(psycopg.errors.ProtocolViolation, match="invalid command"):
            a.execute("SHOW NOTHING")
        with pytest.raises(psycopg.errors.ProtocolViolation, match="invalid command"):
            a.execute("DROP TABLE x")
        with pytest.raises(psycopg.errors.ProtocolViolation, match="no such database"):
            a.execute("PAUSE nosuchdb")
        with pytest.raises(psycopg.errors.ProtocolViolation, match="not paused"):
            a.execute("RESUME")
        with pytest.raises(psycopg.errors.ProtocolViolation, match="client not found"):
            a.execute("KILL_CLIENT 999999")
        with pytest.raises(psycopg.errors.ProtocolViolation, match="SET failed"):
            a.execute("SET listen_port = 1")
        with pytest.raises(psycopg.errors.ProtocolViolation, match="SET failed"):
            a.execute("SET no_such_setting = 1")
        with pytest.raises(psycopg.errors.ProtocolViolation, match="SET failed"):
            a.execute("SET default_pool_size = lots")
        # the simple query protocol too (psycopg's ClientCursor)
        cur = psycopg.ClientCursor(a)
        cur.execute("SHOW STATE")
        assert cur.fetchone() == ("active", "yes")
        assert a.execute("SHOW client_encoding").fetchone() == ("UTF8",)
        a.execute("SET client_encoding = 'UTF8'")  # ignored, as PgBouncer
        assert show(a, "VERSION")


def test_set_changes_a_setting_at_runtime(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory()
    with admin(proc) as a:
        cur = a.execute("SET default_pool_size = 3")
        assert cur.statusmessage == "SET default_pool_size=3"
        config = {r["key"]: r for r in show(a, "CONFIG")}
        assert config["default_pool_size"]["value"] == "3"
        assert config["default_pool_size"]["default"] == "20"
        assert config["default_pool_size"]["changeable"] == "yes"
        assert config["listen_port"]["changeable"] == "no"
        assert {r["name"]: r for r in show(a, "DATABASES")}["app"]["pool_size"] == 3


def _transaction_workers(
    proc: PgtarnProcess, count: int, stop: threading.Event
) -> tuple[list[threading.Thread], list[BaseException], list[int]]:
    errors: list[BaseException] = []
    done = [0] * count

    def work(i: int) -> None:
        try:
            with connect(proc) as c:
                while not stop.is_set():
                    c.execute("select pg_sleep(0.05)")
                    c.execute("select 1")
                    c.commit()
                    done[i] += 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    return threads, errors, done


def test_pause_waits_for_transactions_and_resume_continues(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 2})
    stop = threading.Event()
    threads, errors, done = _transaction_workers(proc, 4, stop)
    try:
        assert wait_for(lambda: sum(done) >= 8)
        with admin(proc) as a:
            cur = a.execute("PAUSE")
            assert cur.statusmessage == "PAUSE"
            # every transaction under way finished; the servers are closed
            assert show(a, "SERVERS") == []
            # (a backend leaves pg_stat_activity a moment after its connection is closed)
            wait_until(
                lambda: (
                    int(
                        pg_cluster.psql(
                            "SELECT count(*) FROM pg_stat_activity WHERE usename = 'app'"
                            " AND pid <> pg_backend_pid()"
                        ).strip()
                    )
                    == 0
                ),
                what="backends gone",
            )
            assert dict(a.execute("SHOW STATE").fetchall())["paused"] == "yes"
            frozen = sum(done)
            time.sleep(0.5)
            assert sum(done) == frozen  # nobody runs while paused
            assert pool_row(a)["cl_waiting"] >= 1
            a.execute("RESUME")
            assert wait_for(lambda: sum(done) >= frozen + 8)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert errors == []


def test_pause_one_database_leaves_the_others(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    base = f"host={pg_cluster.host} port={pg_cluster.port} dbname=app"
    proc = pgtarn_factory(databases={"app": base, "other": base})
    with (
        connect(proc, autocommit=True) as c,
        connect(proc, dbname="other", autocommit=True) as o,
        admin(proc) as a,
    ):
        c.execute("select 1")
        o.execute("select 1")
        a.execute("PAUSE other")
        waiter = Waiter(proc, "select 1")  # on app: served
        waiter.start()
        waiter.join(10)
        assert waiter.result == [(1,)]
        waiter.conn.close()
        blocked = threading.Thread(target=lambda: o.execute("select 7"), daemon=True)
        blocked.start()
        blocked.join(0.5)
        assert blocked.is_alive()  # other waits for RESUME
        dbs = {r["name"]: r for r in show(a, "DATABASES")}
        assert (dbs["other"]["paused"], dbs["app"]["paused"]) == (1, 0)
        with pytest.raises(psycopg.errors.ProtocolViolation, match="not paused"):
            a.execute("RESUME app")
        a.execute("RESUME other")
        blocked.join(10)
        assert not blocked.is_alive()


def test_kill_client_drops_only_that_client(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory()
    with (
        connect(proc, autocommit=True) as victim,
        connect(proc, autocommit=True) as other,
        admin(proc) as a,
    ):
        victim.execute("set application_name = 'victim'")
        other.execute("select 1")
        rows = [r for r in show(a, "CLIENTS") if r["application_name"] == "victim"]
        assert len(rows) == 1
        assert a.execute(f"KILL_CLIENT {rows[0]['id']}").statusmessage == "KILL_CLIENT"
        with pytest.raises(psycopg.OperationalError, match="admin forced disconnect"):
            victim.execute("select 1")
        assert other.execute("select 2").fetchone() == (2,)
        assert not [r for r in show(a, "CLIENTS") if r["application_name"] == "victim"]


def test_kill_database_then_resume(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory()
    with connect(proc, autocommit=True) as c, admin(proc) as a:
        c.execute("select 1")
        a.execute("KILL app")
        with pytest.raises(psycopg.OperationalError, match="admin forced disconnect"):
            c.execute("select 1")
        assert show(a, "SERVERS") == []
        assert {r["name"]: r for r in show(a, "DATABASES")}["app"]["paused"] == 1
        a.execute("RESUME app")
    with connect(proc, autocommit=True) as c:
        assert c.execute("select 3").fetchone() == (3,)


def test_disable_refuses_new_clients_only(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory()
    with connect(proc, autocommit=True) as c, admin(proc) as a:
        c.execute("select 1")
        a.execute("DISABLE app")
        with pytest.raises(psycopg.OperationalError, match='database "app" is disabled'):
            connect(proc)
        assert c.execute("select 2").fetchone() == (2,)  # already connected: unaffected
        assert {r["name"]: r for r in show(a, "DATABASES")}["app"]["disabled"] == 1
        with pytest.raises(psycopg.errors.ProtocolViolation, match="database is required"):
            a.execute("DISABLE")
        a.execute("ENABLE app")
    with connect(proc, autocommit=True) as c:
        assert c.execute("select 3").fetchone() == (3,)


def test_reconnect_and_wait_close(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory()
    with connect(proc) as holder, connect(proc, autocommit=True) as idle_user, admin(proc) as a:
        old_pid = scalar(holder.execute("select pg_backend_pid()"))  # in a transaction
        idle_user.execute("select 1")
        a.execute("RECONNECT app")
        servers = show(a, "SERVERS")
        assert [(r["remote_pid"], r["close_needed"]) for r in servers] == [(old_pid, 1)]
        finished = threading.Event()

        def wait_close() -> None:
            with admin(proc) as a2:
                a2.execute("WAIT_CLOSE app")
            finished.set()

        t = threading.Thread(target=wait_close, daemon=True)
        t.start()
        assert not finished.wait(0.5)  # the holder's server is still in use
        holder.commit()
        assert finished.wait(10)
        assert scalar(holder.execute("select pg_backend_pid()")) != old_pid
        holder.commit()


def test_reload_reports_changed_and_rejected_settings(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory()
    ini = Path(proc.ini_path)
    text = ini.read_text()
    ini.write_text(
        text.replace("default_pool_size = 5", "default_pool_size = 7").replace(
            f"listen_port = {proc.port}", f"listen_port = {proc.port + 1}"
        )
    )
    notices: list[str] = []
    with admin(proc) as a:
        a.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        assert a.execute("RELOAD").statusmessage == "RELOAD"
        assert any("default_pool_size" in n and "changed" in n for n in notices), notices
        assert any("listen_port" in n and "restart" in n for n in notices), notices
        config = {r["key"]: r["value"] for r in show(a, "CONFIG")}
        assert config["default_pool_size"] == "7"
        assert config["listen_port"] == str(proc.port)  # kept until a restart
        ini.write_text("[pgbouncer]\nthis is not a setting\n")
        with pytest.raises(psycopg.errors.lookup("F0000"), match="RELOAD failed"):
            a.execute("RELOAD")
        assert {r["key"]: r["value"] for r in show(a, "CONFIG")}["default_pool_size"] == "7"


def test_shutdown_wait_for_clients(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory()
    c = connect(proc, autocommit=True)
    try:
        with admin(proc) as a:
            assert a.execute("SHUTDOWN WAIT_FOR_CLIENTS").statusmessage == "SHUTDOWN"
        assert c.execute("select 1").fetchone() == (1,)  # still served
        assert proc.proc.poll() is None
    finally:
        c.close()
    assert wait_for(lambda: proc.proc.poll() is not None)
    assert proc.proc.returncode == 0


def test_no_secret_in_any_log_line(pgtarn_factory: PgtarnFactory, pg_roles: dict[str, str]) -> None:
    proc = pgtarn_factory(settings={"log_format": "json", "verbose": 1})
    for user, password in pg_roles.items():  # both a login and a refused one get logged
        with connect(proc, user=user, password=password, autocommit=True) as c:
            assert c.execute("select current_user").fetchone() == (user,)
        refused = "SASL authentication failed"
        with (
            pytest.raises(psycopg.OperationalError, match=refused),
            connect(proc, user=user, password="wrong-" + password),
        ):
            pass
    parameter = "param-secret-7f3e"
    with connect(proc, autocommit=True) as c:  # a bound parameter must not be logged either
        assert c.execute("select %s::text", (parameter,)).fetchone() == (parameter,)
    with admin(proc) as a:
        show(a, "CONFIG")
        show(a, "CLIENTS")
    proc.stop()  # its last lines written whole (read while running, one may be half written)
    text = proc.log_text()
    assert "login attempt" in text
    assert parameter not in text
    secrets = [p for p in pg_roles.values()]
    secrets += [
        line.split('" "')[1].rstrip('"\n')
        for line in Path(proc.ini_path).with_name("userlist.txt").read_text().splitlines()
    ]
    for secret in secrets:
        assert secret not in text
    assert "SCRAM-SHA-256$" not in text
    for line in filter(None, text.splitlines()):
        entry = json.loads(line)  # log_format = json: every line is one object
        assert {"time", "level", "message"} <= entry.keys()


def test_suspend_stops_reading_until_resume(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory()
    with connect(proc, autocommit=True) as c, admin(proc) as a:
        c.execute("select 1")
        assert a.execute("SUSPEND").statusmessage == "SUSPEND"
        assert dict(a.execute("SHOW STATE").fetchall())["suspended"] == "yes"
        with pytest.raises(psycopg.errors.ProtocolViolation, match="already suspended"):
            a.execute("PAUSE")
        t, result = blocked_query(c, "select 5")  # not even read
        a.execute("RESUME")
        t.join(10)
        assert result == [(5,)]
        assert dict(a.execute("SHOW STATE").fetchall())["active"] == "yes"


def test_sigusr1_pauses_and_sigusr2_resumes(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory()
    with connect(proc, autocommit=True) as c, admin(proc) as a:
        c.execute("select 1")
        proc.send_signal(signal.SIGUSR1)
        assert wait_for(lambda: dict(a.execute("SHOW STATE").fetchall())["paused"] == "yes")
        assert wait_for(lambda: show(a, "SERVERS") == [])  # idle servers closed
        t, result = blocked_query(c, "select 6")
        proc.send_signal(signal.SIGUSR2)
        t.join(10)
        assert result == [(6,)]


def test_shutdown_wait_for_servers_lets_the_transaction_finish(
    pgtarn_factory: PgtarnFactory,
) -> None:
    proc = pgtarn_factory()
    c = connect(proc)
    try:
        c.execute("select 1")  # a transaction under way
        with admin(proc) as a:
            assert a.execute("SHUTDOWN WAIT_FOR_SERVERS").statusmessage == "SHUTDOWN"
        time.sleep(0.3)
        assert proc.proc.poll() is None  # waits for the transaction
        assert c.execute("select 2").fetchone() == (2,)
        c.commit()
        assert wait_for(lambda: proc.proc.poll() is not None)
    finally:
        c.close()


def test_connection_logging_can_be_turned_off(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"log_connections": 0, "log_disconnections": 0})
    with connect(proc, autocommit=True) as c:
        c.execute("select 1")
    time.sleep(0.2)
    text = proc.log_text()
    assert "login attempt" not in text and "closing because" not in text
    assert "new connection to server" not in text
    loud = pgtarn_factory()
    with connect(loud, autocommit=True) as c:
        c.execute("select 1")
    assert wait_for(lambda: "closing because" in loud.log_text())
    line = next(x for x in loud.log_text().splitlines() if "login attempt" in x)
    assert "C-" in line and "app@127.0.0.1:" in line and "db=app user=app" in line


def test_a_waiting_pause_is_cancelled_by_resume(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"pool_mode": "session"})
    with connect(proc, autocommit=True) as holder, admin(proc) as a, admin(proc) as b:
        holder.execute("select 1")  # session mode: the server stays with this client
        outcome: list[BaseException | str] = []

        def pause() -> None:
            try:
                outcome.append(a.execute("PAUSE").statusmessage or "")
            except psycopg.Error as exc:
                outcome.append(exc)

        t = threading.Thread(target=pause, daemon=True)
        t.start()
        t.join(0.5)
        assert t.is_alive()  # waits for the session to end
        b.execute("RESUME")
        t.join(10)
        assert len(outcome) == 1 and isinstance(outcome[0], psycopg.errors.ProtocolViolation)
        assert "cancelled" in str(outcome[0])
        assert dict(a.execute("SHOW STATE").fetchall())["active"] == "yes"  # a works on
        assert holder.execute("select 2").fetchone() == (2,)


def test_sigusr2_ends_a_suspend(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory()
    with connect(proc, autocommit=True) as c, admin(proc) as a:
        c.execute("select 1")
        a.execute("SUSPEND")
        t, result = blocked_query(c, "select 8", wait=0.3)
        proc.send_signal(signal.SIGUSR2)
        t.join(10)
        assert result == [(8,)]
        assert dict(a.execute("SHOW STATE").fetchall())["suspended"] == "no"


def test_admin_logins_have_a_reserve_past_max_client_conn(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"max_client_conn": 1})
    with connect(proc, autocommit=True) as c:
        c.execute("select 1")
        with pytest.raises(psycopg.OperationalError, match="max_client_conn"):
            connect(proc)
        with admin(proc) as a:  # the operator still gets in
            assert pool_row(a)["cl_active"] == 1


def test_a_refused_begin_in_statement_mode_ends_the_client(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"pool_mode": "statement"})
    with connect(proc, autocommit=True) as c, admin(proc) as a:
        c.execute("set application_name = 'stmt'")
        assert [r["application_name"] for r in show(a, "CLIENTS")].count("stmt") == 1
        with pytest.raises(psycopg.OperationalError, match="statement pooling mode"):
            c.execute("begin")
        assert wait_for(lambda: all(r["application_name"] != "stmt" for r in show(a, "CLIENTS")))


def test_reload_with_a_logfile_that_cannot_be_opened_keeps_everything(
    pgtarn_factory: PgtarnFactory,
) -> None:
    proc = pgtarn_factory()
    ini = Path(proc.ini_path)
    text = ini.read_text()
    assert proc.logfile and f"logfile = {proc.logfile}" in text
    ini.write_text(
        text.replace(f"logfile = {proc.logfile}", "logfile = /nonexistent-dir/pgtarn.log").replace(
            "default_pool_size = 5", "default_pool_size = 9"
        )
    )
    with admin(proc) as a:
        with pytest.raises(psycopg.errors.lookup("F0000")):
            a.execute("RELOAD")
        config = {r["key"]: r["value"] for r in show(a, "CONFIG")}
        assert config["default_pool_size"] == "5" and config["logfile"] == proc.logfile
    before = Path(proc.logfile).read_text().count("login attempt")
    with connect(proc, autocommit=True) as c:
        c.execute("select 1")
    assert Path(proc.logfile).read_text().count("login attempt") == before + 1


def test_console_logins_and_commands_are_counted(pgtarn_factory: PgtarnFactory) -> None:
    """As PgBouncer: SHOW STATS' "pgbouncer" row counts console logins, and each command as
    a query and a transaction (SHOW TOTALS adds them to the pools')."""
    proc = pgtarn_factory()
    for _ in range(2):
        with admin(proc) as a:
            a.execute("SHOW VERSION")
    with connect(proc, autocommit=True) as c:
        c.execute("select 1")
    with admin(proc) as a:
        row = {r["database"]: r for r in show(a, "STATS")}["pgbouncer"]
        assert row["total_client_login_count"] == 3
        assert row["total_query_count"] == row["total_xact_count"] == 3  # 2 SHOW VERSION, this
        totals = dict(a.execute("SHOW TOTALS").fetchall())
        assert totals["total_client_login_count"] == 4  # and the app's client
        assert totals["total_xact_count"] == 5  # and the app's select, and this SHOW


def test_show_mem_counts_what_pgtarn_holds(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory()
    with connect(proc, autocommit=True) as c1, connect(proc, autocommit=True) as c2:
        c1.execute("select 1")
        c2.execute("select 2")
        with admin(proc) as a:
            servers = len(show(a, "SERVERS"))
            mem = {r["name"]: r for r in show(a, "MEM")}
            assert mem["clients"]["used"] == 3  # the two and this console session
            assert mem["servers"]["used"] == servers >= 1
            assert mem["pools"]["used"] == 1
            for row in mem.values():
                assert row["free"] == 0  # nothing is kept for reuse
                assert row["memtotal"] >= row["size"] * row["used"]
                assert (row["size"] > 0) == (row["used"] > 0), row
            # no DNS cache: the system's resolver is asked each time
            assert show(a, "DNS_HOSTS") == [] and show(a, "DNS_ZONES") == []
