"""Replication connections through pgtarn: physical (pg_basebackup, pg_receivewal), logical
(pg_recvlogical, a CREATE SUBSCRIPTION pointed at pgtarn), and PostgreSQL's refusals."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support import PgtarnProcess, PostgresNotFound, TempCluster
from tests.support.conninfo import make_dsn

from .conftest import PgtarnFactory

REPL_ROLES = {"repl_user": "repl_pass", "plain_user": "plain_pass"}
"""repl_user has REPLICATION; plain_user does not."""

TOOL_TIMEOUT = 60.0


class ReplicationCluster(TempCluster):
    """A TempCluster fit for replication: wal_level = logical, wal senders and slots, and a
    pg_hba.conf `replication` line (SCRAM) for every role over TCP."""

    def _settings(self) -> dict[str, str]:
        return {
            **super()._settings(),
            "wal_level": "logical",
            "max_wal_senders": "10",
            "max_replication_slots": "10",
            "max_connections": "50",
        }

    def _initdb(self) -> None:
        super()._initdb()
        hba = Path(self.data_dir) / "pg_hba.conf"
        lines = [
            f"host replication all {address}/{32 if ':' not in address else 128} scram-sha-256"
            for address in self._listen_addresses()
        ]
        with open(hba, "a", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def repl_cluster() -> Iterator[ReplicationCluster]:
    """The replication cluster, with REPL_ROLES and database app (table events, a
    publication of it) and database sub (the same table, for a subscription)."""
    try:
        cluster = ReplicationCluster()
    except PostgresNotFound as exc:
        pytest.skip(f"replication tests need PostgreSQL server binaries: {exc}")
    cluster.start()
    try:
        cluster.create_role("repl_user", REPL_ROLES["repl_user"])
        cluster.psql("ALTER ROLE repl_user REPLICATION;\n")
        cluster.create_role("plain_user", REPL_ROLES["plain_user"])
        cluster.psql("CREATE DATABASE app;\nCREATE DATABASE sub;\n")
        table = "CREATE TABLE events (id int PRIMARY KEY, note text);\n"
        cluster.psql(
            table + "GRANT SELECT ON events TO repl_user;\n"
            "CREATE PUBLICATION events_pub FOR TABLE events;\n",
            dbname="app",
        )
        cluster.psql(table, dbname="sub")
        yield cluster
    finally:
        cluster.cleanup()


@pytest.fixture
def repl_pgtarn(
    repl_cluster: ReplicationCluster, pgtarn_factory: PgtarnFactory, request: pytest.FixtureRequest
) -> tuple[str, int]:
    """pgtarn in front of the replication cluster (pool_mode from the test's param,
    transaction by default): (host, port)."""
    mode = getattr(request, "param", "transaction")
    proc = _start(repl_cluster, pgtarn_factory, pool_mode=mode, default_pool_size=3)
    return proc.host, proc.port


def _start(
    cluster: ReplicationCluster, factory: PgtarnFactory, **settings: object
) -> PgtarnProcess:
    """pgtarn in front of the replication cluster, database app, repl_user its admin, with
    these settings."""
    base = f"host={cluster.host} port={cluster.port}"
    return factory(
        databases={"app": f"{base} dbname=app", "*": base},
        settings={"admin_users": "repl_user", **settings},
        userlist=REPL_ROLES,
    )


def _tool(
    cluster: TempCluster, name: str, *args: str, password: str = REPL_ROLES["repl_user"]
) -> subprocess.CompletedProcess[str]:
    """Run a PostgreSQL client program (as this process's user) with PGPASSWORD."""
    env = {**os.environ, "PGPASSWORD": password, "PGCONNECT_TIMEOUT": "10"}
    return subprocess.run(
        [os.path.join(cluster.bindir, name), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT,
        check=False,
    )


def _conninfo(address: tuple[str, int], user: str = "repl_user", dbname: str = "app") -> str:
    host, port = address
    return make_dsn(host=host, port=port, user=user, dbname=dbname)


def _params(host: str, port: int, dbname: str = "app", **extra: object) -> dict[str, Any]:
    """psycopg.connect's arguments for repl_user (autocommit) at host:port."""
    return {
        "host": host,
        "port": port,
        "user": "repl_user",
        "dbname": dbname,
        "password": REPL_ROLES["repl_user"],
        "autocommit": True,
        **extra,
    }


def _admin_rows(host: str, port: int, what: str) -> list[dict[str, Any]]:
    """The rows of the admin console's SHOW <what>, each by column name."""
    with psycopg.connect(**_params(host, port, dbname="pgbouncer")) as admin:
        cursor = admin.execute(f"SHOW {what}")
        assert cursor.description is not None
        names = [column.name for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _show(host: str, port: int, what: str) -> list[tuple[str, str]]:
    """(replication, state) of the SHOW CLIENTS or SERVERS rows of replication connections."""
    rows = _admin_rows(host, port, what)
    return [(row["replication"], row["state"]) for row in rows if row["replication"] != "none"]


def _basebackup(
    cluster: TempCluster, address: tuple[str, int], target: Path
) -> subprocess.CompletedProcess[str]:
    """pg_basebackup through pgtarn at address into target, its WAL streamed."""
    return _tool(
        cluster,
        "pg_basebackup",
        "-d",
        _conninfo(address),
        "-D",
        str(target),
        "-X",
        "stream",
        "-c",
        "fast",
        "--no-sync",
    )


def _lsn(cluster: TempCluster, sql: str = "SELECT pg_current_wal_lsn()") -> str:
    return cluster.psql(f"\\pset tuples_only on\n\\pset format unaligned\n{sql};\n").strip()


@pytest.mark.parametrize("repl_pgtarn", ["transaction", "statement", "session"], indirect=True)
def test_pg_basebackup_through_pgtarn(
    repl_cluster: ReplicationCluster, repl_pgtarn: tuple[str, int], tmp_path: Path
) -> None:
    target = tmp_path / "base"
    result = _basebackup(repl_cluster, repl_pgtarn, target)
    assert result.returncode == 0, result.stderr
    assert (target / "PG_VERSION").read_text().strip() == "15"
    assert (target / "global" / "pg_control").exists()


def test_pg_receivewal_writes_a_segment(
    repl_cluster: ReplicationCluster, repl_pgtarn: tuple[str, int], tmp_path: Path
) -> None:
    slot = "receivewal_slot"
    repl_cluster.psql(f"SELECT pg_create_physical_replication_slot('{slot}', true);\n")
    try:
        first = _lsn(repl_cluster, "SELECT pg_walfile_name(pg_current_wal_lsn())")
        repl_cluster.psql(
            "INSERT INTO events VALUES (100, 'wal');\nSELECT pg_switch_wal();\n", dbname="app"
        )
        end = _lsn(repl_cluster)
        target = tmp_path / "wal"
        target.mkdir()
        result = _tool(
            repl_cluster,
            "pg_receivewal",
            "-d",
            _conninfo(repl_pgtarn),
            "-D",
            str(target),
            "-S",
            slot,
            "--endpos",
            end,
            "-n",
            "--no-sync",
        )
        assert result.returncode == 0, result.stderr
        # the segment that was current when the slot was made, whole (not .partial)
        assert (target / first).stat().st_size == 16 * 1024 * 1024
    finally:
        repl_cluster.psql(f"SELECT pg_drop_replication_slot('{slot}');\n")
        repl_cluster.psql("DELETE FROM events WHERE id = 100;\n", dbname="app")


def test_pg_recvlogical_receives_a_change(
    repl_cluster: ReplicationCluster, repl_pgtarn: tuple[str, int], tmp_path: Path
) -> None:
    slot = "recvlogical_slot"
    conninfo = _conninfo(repl_pgtarn)
    created = _tool(
        repl_cluster,
        "pg_recvlogical",
        "-d",
        conninfo,
        "-S",
        slot,
        "--create-slot",
        "-P",
        "test_decoding",
    )
    assert created.returncode == 0, created.stderr
    try:
        repl_cluster.psql("INSERT INTO events VALUES (200, 'decoded');\n", dbname="app")
        out = tmp_path / "changes.txt"
        env = {**os.environ, "PGPASSWORD": REPL_ROLES["repl_user"]}
        receiver = subprocess.Popen(
            [
                os.path.join(repl_cluster.bindir, "pg_recvlogical"),
                "-d",
                conninfo,
                "-S",
                slot,
                "--start",
                "-n",
                "-F",
                "0",
                "-f",
                str(out),
            ],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        expected = "table public.events: INSERT: id[integer]:200 note[text]:'decoded'"
        text = ""
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and receiver.poll() is None:
                text = out.read_text() if out.exists() else ""
                if expected in text:
                    break
                time.sleep(0.1)
        finally:
            receiver.send_signal(signal.SIGINT)
            _, errors = receiver.communicate(timeout=TOOL_TIMEOUT)
        assert expected in text, errors
    finally:
        dropped = _tool(repl_cluster, "pg_recvlogical", "-d", conninfo, "-S", slot, "--drop-slot")
        repl_cluster.psql("DELETE FROM events WHERE id = 200;\n", dbname="app")
    assert dropped.returncode == 0, dropped.stderr


def test_subscription_through_pgtarn(
    repl_cluster: ReplicationCluster, repl_pgtarn: tuple[str, int]
) -> None:
    # Publisher and subscriber share the cluster: the slot is made ahead (CREATE
    # SUBSCRIPTION making it would wait for its own transaction).
    host, port = repl_pgtarn
    slot = "sub_slot"
    repl_cluster.psql(
        f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput');\n", dbname="app"
    )
    repl_cluster.psql("INSERT INTO events VALUES (1, 'before'), (2, 'copied');\n", dbname="app")
    conninfo = make_dsn(
        host=host, port=port, user="repl_user", dbname="app", password=REPL_ROLES["repl_user"]
    )
    repl_cluster.psql(
        f"CREATE SUBSCRIPTION events_sub CONNECTION '{conninfo}' "
        f"PUBLICATION events_pub WITH (create_slot = false, slot_name = '{slot}');\n",
        dbname="sub",
    )
    try:
        repl_cluster.psql("INSERT INTO events VALUES (3, 'streamed');\n", dbname="app")
        rows = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rows = repl_cluster.psql(
                "\\pset tuples_only on\n\\pset format unaligned\n"
                "SELECT string_agg(id || ':' || note, ',' ORDER BY id) "
                "FROM events;\n",
                dbname="sub",
            ).strip()
            if rows == "1:before,2:copied,3:streamed":
                break
            time.sleep(0.2)
        assert rows == "1:before,2:copied,3:streamed"
    finally:
        repl_cluster.psql("DROP SUBSCRIPTION events_sub;\n", dbname="sub")
        repl_cluster.psql("DELETE FROM events;\n", dbname="app")
        repl_cluster.psql("DELETE FROM events;\n", dbname="sub")


def _logfile(proc: PgtarnProcess) -> str:
    assert proc.logfile is not None
    return Path(proc.logfile).read_text(encoding="utf-8")


@pytest.mark.parametrize("mode", ["database", "true"])
def test_unprivileged_role_gets_login_failed(
    repl_cluster: ReplicationCluster, pgtarn_factory: PgtarnFactory, mode: str
) -> None:
    """PostgreSQL refuses a role without REPLICATION: as PgBouncer, the client is told
    "login failed" and both sides close with that reason; PostgreSQL's words are in the
    client's DETAIL and in the log."""
    proc = _start(repl_cluster, pgtarn_factory)
    refusal = "must be superuser or replication role to start walsender"
    with pytest.raises(psycopg.OperationalError) as caught:
        psycopg.connect(
            host=proc.host,
            port=proc.port,
            user="plain_user",
            dbname="app",
            password=REPL_ROLES["plain_user"],
            replication=mode,
        )
    message = str(caught.value)
    assert re.search(r"FATAL:  login failed\n", message), message
    assert f"DETAIL:  {refusal}" in message
    assert re.search(r"server login failed", message) is None

    closing = re.compile(r"closing because: login failed \(age=")
    log = _logfile(proc)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(closing.findall(log)) < 2:
        time.sleep(0.05)  # (the client's line may come as its connection is gone)
        log = _logfile(proc)
    assert len(closing.findall(log)) == 2, log  # the server's and the client's
    assert refusal in log
    # the pool is not made to fail: a normal login right after works
    with psycopg.connect(
        host=proc.host,
        port=proc.port,
        user="plain_user",
        dbname="app",
        password=REPL_ROLES["plain_user"],
    ) as normal:
        assert normal.execute("SELECT 1").fetchone() == (1,)


def _walsenders(cluster: TempCluster) -> int:
    return int(
        _lsn(cluster, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender'")
    )


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 20
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _pool(host: str, port: int) -> dict[str, Any]:
    """SHOW POOLS' row of app/repl_user."""
    rows = _admin_rows(host, port, "POOLS")
    return next((r for r in rows if r["database"] == "app" and r["user"] == "repl_user"), {})


def test_replication_server_is_its_own(
    repl_cluster: ReplicationCluster, repl_pgtarn: tuple[str, int]
) -> None:
    """A replication client's server is never lent to another client, and it ends with its
    client."""
    host, port = repl_pgtarn
    with psycopg.connect(**_params(host, port, replication="database")) as walsender:
        system = walsender.execute("IDENTIFY_SYSTEM").fetchone()
        assert system is not None and system[3] == "app"
        with psycopg.connect(**_params(host, port)) as normal:
            assert normal.execute("SELECT 1").fetchone() == (1,)
        assert _walsenders(repl_cluster) == 1
        assert _show(host, port, "CLIENTS") == [("logical", "active")]
        assert _show(host, port, "SERVERS") == [("logical", "active")]
    _wait_until(lambda: _walsenders(repl_cluster) == 0, "the walsender to end")


def test_replication_clients_queue_within_pool_size(
    repl_cluster: ReplicationCluster, pgtarn_factory: PgtarnFactory
) -> None:
    """As PgBouncer: a replication server counts in pool_size; the next replication client
    waits (SHOW POOLS' cl_waiting) until a server of the pool is gone."""
    proc = _start(repl_cluster, pgtarn_factory, default_pool_size=1)
    params = _params(proc.host, proc.port, replication="database", connect_timeout=30)
    first = psycopg.connect(**params)
    second: list[psycopg.Connection[Any]] = []
    errors: list[BaseException] = []

    def connect_second() -> None:
        try:
            second.append(psycopg.connect(**params))
        except BaseException as exc:  # (reported by the test's thread)
            errors.append(exc)

    waiter = threading.Thread(target=connect_second)
    waiter.start()
    try:
        _wait_until(
            lambda: (
                _pool(proc.host, proc.port).get("cl_waiting") == 1 or errors != [] or second != []
            ),
            "the second replication client to queue",
        )
        assert second == [] and errors == []
        assert _walsenders(repl_cluster) == 1
        first.close()  # its server goes: the waiting client gets one
        waiter.join(timeout=30)
        assert errors == [] and len(second) == 1
        system = second[0].execute("IDENTIFY_SYSTEM").fetchone()
        assert system is not None and system[3] == "app"
        assert _walsenders(repl_cluster) == 1
    finally:
        first.close()
        waiter.join(timeout=30)
        for conn in second:
            conn.close()


def test_a_lost_walsender_frees_its_place(
    repl_cluster: ReplicationCluster, pgtarn_factory: PgtarnFactory
) -> None:
    """A walsender PostgreSQL ends mid-stream: its client is told, and its place in the pool
    goes to the next replication client; one that waits query_wait_timeout gets the error."""
    proc = _start(repl_cluster, pgtarn_factory, default_pool_size=1, query_wait_timeout=1)
    params = _params(proc.host, proc.port, replication="database")
    first = psycopg.connect(**params)
    try:
        with pytest.raises(psycopg.OperationalError) as caught:
            psycopg.connect(**params)  # the pool is full for longer than query_wait_timeout
        assert "query_wait_timeout" in str(caught.value)
        repl_cluster.psql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE backend_type = 'walsender';\n"
        )
        with pytest.raises(psycopg.OperationalError):
            first.execute("IDENTIFY_SYSTEM")
        with psycopg.connect(**params) as second:
            system = second.execute("IDENTIFY_SYSTEM").fetchone()
            assert system is not None and system[3] == "app"
    finally:
        first.close()


def test_replication_client_evicts_an_idle_server(
    repl_cluster: ReplicationCluster, pgtarn_factory: PgtarnFactory
) -> None:
    """The pool is full of idle servers: the oldest is closed ("evicted") to make room for a
    replication server, as PgBouncer does."""
    proc = _start(repl_cluster, pgtarn_factory, default_pool_size=1)
    params = _params(proc.host, proc.port)
    with psycopg.connect(**params) as normal:
        assert normal.execute("SELECT 1").fetchone() == (1,)
    assert _pool(proc.host, proc.port)["sv_idle"] == 1
    with psycopg.connect(**params, replication="database") as walsender:
        system = walsender.execute("IDENTIFY_SYSTEM").fetchone()
        assert system is not None and system[3] == "app"
        assert "closing because: evicted" in _logfile(proc)
        assert _pool(proc.host, proc.port)["sv_idle"] == 0
        with psycopg.connect(**_params(repl_cluster.host, repl_cluster.port)) as direct:
            backends = direct.execute(
                "SELECT backend_type FROM pg_stat_activity WHERE usename = 'repl_user' "
                "AND pid <> pg_backend_pid() ORDER BY 1"
            ).fetchall()
        assert backends == [("walsender",)]


def test_pgtarn_hba_needs_the_replication_keyword_for_physical(
    repl_cluster: ReplicationCluster, pgtarn_factory: PgtarnFactory, tmp_path: Path
) -> None:
    """Under auth_type = hba, pgtarn's own pg_hba.conf decides as PostgreSQL's would: a
    physical replication connection matches only a `replication` line, a logical one the
    lines of its database."""
    hba = tmp_path / "pgtarn_hba.conf"
    hba.write_text("host all all 127.0.0.1/32 scram-sha-256\n", encoding="utf-8")
    proc = _start(repl_cluster, pgtarn_factory, auth_type="hba", auth_hba_file=str(hba))
    params = _params(proc.host, proc.port)
    with psycopg.connect(**params, replication="database") as logical:
        assert logical.execute("IDENTIFY_SYSTEM").fetchone() is not None
    with pytest.raises(psycopg.OperationalError) as caught:
        psycopg.connect(**params, replication="true")
    assert (
        'no pg_hba.conf entry for replication connection from host "127.0.0.1", '
        'user "repl_user", no encryption'
    ) in str(caught.value)


def test_pg_basebackup_with_small_socket_buffers(
    repl_cluster: ReplicationCluster, pgtarn_factory: PgtarnFactory, tmp_path: Path
) -> None:
    """tcp_socket_buffer = 4096 (PgBouncer's tests use it): the buffers of a server
    connection are set before it connects, so a base backup streams to its end."""
    proc = _start(repl_cluster, pgtarn_factory, tcp_socket_buffer=4096)
    target = tmp_path / "base"
    result = _basebackup(repl_cluster, (proc.host, proc.port), target)
    assert result.returncode == 0, result.stderr
    assert (target / "global" / "pg_control").exists()
