"""SIGHUP: pool sizes, auth_file and [databases] changes apply to a running pgtarn;
an invalid file keeps the old configuration."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import asyncpg
import psycopg

from tests.support import PgtarnProcess, TempCluster, userlist_line

from .conftest import ROLE_PASSWORDS, PgtarnFactory
from .drivers import aconnect, connect
from .faultproxy import FaultProxy
from .pgstat import make_table, rows, wait_for

RELOAD_USER = "reload_user"


def reload(
    proc: PgtarnProcess, ini: str | None = None, marker: str = "configuration reloaded"
) -> None:
    """Write ini (if given), send SIGHUP and wait for one more `marker` line in the log."""
    before = proc.log_text().count(marker)
    if ini is not None:
        Path(proc.ini_path).write_text(ini, encoding="utf-8")
    proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: proc.log_text().count(marker) > before), proc.log_text()


def edit_ini(proc: PgtarnProcess, old: str, new: str) -> str:
    text = Path(proc.ini_path).read_text(encoding="utf-8")
    assert old in text, text
    return text.replace(old, new)


def concurrent_pids(proc: PgtarnProcess, clients: int = 3) -> set[int]:
    """Backend pids that `clients` concurrent asyncpg clients get for one 0.3 s query each."""

    async def run() -> set[int]:
        conns = []
        try:
            for _ in range(clients):
                conns.append(await aconnect(proc))
            pids = await asyncio.gather(
                *(c.fetchval("select pg_backend_pid() from pg_sleep(0.6)") for c in conns)
            )
        finally:
            for conn in conns:
                await conn.close()
        return set(pids)

    return asyncio.run(run())


def live_backends(pg_cluster: TempCluster, pids: set[int]) -> int:
    listed = ", ".join(str(p) for p in pids)
    out = pg_cluster.psql(f"SELECT count(*) FROM pg_stat_activity WHERE pid IN ({listed})")
    return int(out.strip())


def app_backends(pg_cluster: TempCluster) -> int:
    out = pg_cluster.psql("SELECT count(*) FROM pg_stat_activity WHERE usename = 'app'")
    return int(out.strip())


def write_userlist(proc: PgtarnProcess, entries: dict[str, str]) -> None:
    path = Path(proc.ini_path).parent / "userlist.txt"
    path.write_text("".join(userlist_line(u, p) for u, p in entries.items()), encoding="utf-8")


def login_error(proc: PgtarnProcess, user: str, password: str) -> psycopg.OperationalError | None:
    """None when user/password logs in (and runs a query), else the error."""
    try:
        with connect(proc, user=user, password=password, autocommit=True) as conn:
            assert conn.execute("select current_user").fetchone() == (user,)
    except psycopg.OperationalError as exc:
        return exc
    return None


def login_sqlstate(proc: PgtarnProcess, user: str, password: str) -> str | None:
    """SQLSTATE of a failed login as asyncpg sees it (psycopg gives none), None on success."""

    async def attempt() -> str | None:
        try:
            conn = await aconnect(proc, user=user, password=password)
        except asyncpg.PostgresError as exc:
            return str(exc.sqlstate)
        await conn.close()
        return None

    return asyncio.run(attempt())


def test_pool_size_raised_and_lowered(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    with connect(proc, autocommit=True) as kept:
        kept_pid = kept.execute("select pg_backend_pid()").fetchone()
        assert kept_pid is not None
        assert len(concurrent_pids(proc)) == 1
        reload(proc, edit_ini(proc, "default_pool_size = 1", "default_pool_size = 3"))
        assert kept.execute("select 2").fetchone() == (2,)
        pids = concurrent_pids(proc)
        assert len(pids) == 3
        assert kept.execute("select 3").fetchone() == (3,)

        reload(proc, edit_ini(proc, "default_pool_size = 3", "default_pool_size = 1"))
        # the idle servers beyond the new size are closed at once
        assert wait_for(lambda: live_backends(pg_cluster, pids) <= 1)
        assert wait_for(lambda: app_backends(pg_cluster) <= 1)
        assert kept.execute("select 4").fetchone() == (4,)
        assert len(concurrent_pids(proc)) == 1
        assert kept.execute("select 5").fetchone() == (5,)


def test_auth_file_changes_apply_on_reload(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    pg_cluster.psql(
        "DO $$ BEGIN\n"
        f"  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{RELOAD_USER}') THEN\n"
        f"    CREATE ROLE {RELOAD_USER} LOGIN;\n"
        "  END IF;\n"
        "END $$;\n"
        "SET password_encryption = 'scram-sha-256';\n"
        f"ALTER ROLE {RELOAD_USER} PASSWORD 'p1';\n"
    )
    entries = dict(ROLE_PASSWORDS)
    proc = pgtarn_factory(userlist=entries)
    assert login_error(proc, RELOAD_USER, "p1") is not None  # not in the auth_file yet

    # a new entry
    write_userlist(proc, {**entries, RELOAD_USER: "p1"})
    reload(proc)
    assert login_error(proc, RELOAD_USER, "p1") is None
    with (
        connect(proc, user=RELOAD_USER, password="p1", autocommit=True) as before,
        connect(proc, autocommit=True) as app_before,
    ):
        assert before.execute("select current_user").fetchone() == (RELOAD_USER,)
        assert app_before.execute("select 1").fetchone() == (1,)

        # a changed password (in PostgreSQL too, so that new servers can log in)
        pg_cluster.psql(
            f"SET password_encryption = 'scram-sha-256';\nALTER ROLE {RELOAD_USER} PASSWORD 'p2';\n"
        )
        write_userlist(proc, {**entries, RELOAD_USER: "p2"})
        reload(proc)
        assert login_error(proc, RELOAD_USER, "p2") is None
        error = login_error(proc, RELOAD_USER, "p1")
        assert error is not None and "SASL authentication failed" in str(error), error
        assert login_sqlstate(proc, RELOAD_USER, "p1") == "28P01"

        # clients logged in before the reload keep working
        assert before.execute("select current_user").fetchone() == (RELOAD_USER,)
        assert app_before.execute("select 2").fetchone() == (2,)
    assert login_error(proc, "app", "app_pass") is None


def test_changed_connection_string_waits_for_the_transaction(
    pgtarn_factory: PgtarnFactory,
    pg_cluster: TempCluster,
    fault_proxy: FaultProxy,
) -> None:
    table = make_table(pg_cluster, "reload_")
    via_proxy = f"host={fault_proxy.host} port={fault_proxy.port} dbname=app"
    direct = f"host={pg_cluster.host} port={pg_cluster.port} dbname=app"
    proc = pgtarn_factory(databases={"app": via_proxy})
    with connect(proc) as a:
        a.execute(f"INSERT INTO {table} VALUES (1)")
        row = a.execute("select pg_backend_pid()").fetchone()
        assert row is not None
        old_pid = row[0]
        assert fault_proxy.active() == 1

        reload(proc, edit_ini(proc, f"app = {via_proxy}", f"app = {direct}"))
        # A's transaction goes on on its old server and commits
        a.execute(f"INSERT INTO {table} VALUES (2)")
        assert a.execute("select pg_backend_pid()").fetchone() == (old_pid,)
        a.commit()
        assert rows(pg_cluster, table) == [1, 2]

        # then the old server is closed and new work goes straight to PostgreSQL
        assert wait_for(lambda: fault_proxy.active() == 0)
        assert wait_for(lambda: live_backends(pg_cluster, {old_pid}) == 0)
        accepted = fault_proxy.accepted
        a.execute(f"INSERT INTO {table} VALUES (3)")
        new_pid = a.execute("select pg_backend_pid()").fetchone()
        a.commit()
        assert new_pid is not None and new_pid[0] != old_pid
        with connect(proc, autocommit=True) as b:
            assert b.execute("select 1").fetchone() == (1,)
        assert fault_proxy.accepted == accepted
        assert fault_proxy.active() == 0
    assert rows(pg_cluster, table) == [1, 2, 3]


def test_invalid_config_keeps_the_old_one(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    good = Path(proc.ini_path).read_text(encoding="utf-8")
    with connect(proc, autocommit=True) as kept:
        assert kept.execute("select 1").fetchone() == (1,)
        reload(
            proc,
            edit_ini(proc, "default_pool_size = 1", "default_pool_size = lots"),
            marker="reload failed",
        )
        assert proc.proc.poll() is None
        assert kept.execute("select 2").fetchone() == (2,)
        with connect(proc, autocommit=True) as fresh:
            assert fresh.execute("select 3").fetchone() == (3,)
        assert len(concurrent_pids(proc)) == 1  # still default_pool_size = 1

        # a valid file afterwards is taken again
        reload(proc, good.replace("default_pool_size = 1", "default_pool_size = 3"))
        assert len(concurrent_pids(proc)) == 3
        assert kept.execute("select 4").fetchone() == (4,)


def pooler_keepalive(proc: PgtarnProcess, conn: psycopg.Connection[Any]) -> bool:
    """Whether pgtarn's end of conn's TCP connection has SO_KEEPALIVE: ss shows its timer,
    once no sent data waits for an ACK (whose retransmission timer ss would show instead)."""
    with socket.fromfd(conn.fileno(), socket.AF_INET, socket.SOCK_STREAM) as sock:
        client_port = sock.getsockname()[1]
    command = [
        "ss",
        "-tnoH",
        "state",
        "established",
        f"( sport = :{proc.port} and dport = :{client_port} )",
    ]
    out = ""

    def settled() -> bool:
        nonlocal out
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        assert out.strip(), f"no socket of pgtarn's towards port {client_port}"
        return "timer:(on" not in out

    assert wait_for(settled), out
    return "timer:(keepalive" in out


def test_tcp_keepalive_of_clients_follows_reload(pgtarn_factory: PgtarnFactory) -> None:
    # set on the listening sockets, which accepted sockets inherit (none set per client)
    proc = pgtarn_factory(settings={"tcp_keepalive": 1})
    with connect(proc) as first:
        assert pooler_keepalive(proc, first)
        reload(proc, edit_ini(proc, "tcp_keepalive = 1", "tcp_keepalive = 0"))
        with connect(proc) as second:
            assert not pooler_keepalive(proc, second)
            assert pooler_keepalive(proc, first)  # a connection keeps what it had
        reload(proc, edit_ini(proc, "tcp_keepalive = 0", "tcp_keepalive = 1"))
        with connect(proc) as third:
            assert pooler_keepalive(proc, third)


def _keepalive_seconds(out: str) -> float:
    """The time left on the first keepalive timer ss shows, in seconds."""
    match = re.search(r"timer:\(keepalive,(?:(\d+)min)?(?:([\d.]+)sec)?(?:(\d+)ms)?", out)
    assert match, out
    minutes, seconds, millis = match.groups()
    return int(minutes or 0) * 60 + float(seconds or 0) + int(millis or 0) / 1000


def test_tcp_keepidle_of_clients_and_servers(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    # the system's idle time is 7200 s: tcp_keepidle sets pgtarn's side of both connections
    proc = pgtarn_factory(settings={"tcp_keepalive": 1, "tcp_keepidle": 77})
    with connect(proc, autocommit=True) as conn:
        conn.execute("select 1")
        assert pooler_keepalive(proc, conn)
        with socket.fromfd(conn.fileno(), socket.AF_INET, socket.SOCK_STREAM) as sock:
            client_port = sock.getsockname()[1]
        out = subprocess.run(
            [
                "ss",
                "-tnoH",
                "state",
                "established",
                f"( sport = :{proc.port} and dport = :{client_port} )",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert 0 < _keepalive_seconds(out) <= 77
        servers = subprocess.run(
            ["ss", "-tnoH", "state", "established", f"( dport = :{pg_cluster.port} )"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        # pgtarn's servers, among the suite's other connections to the cluster
        assert any(
            0 < _keepalive_seconds(line) <= 77
            for line in servers.splitlines()
            if "keepalive" in line
        ), servers
