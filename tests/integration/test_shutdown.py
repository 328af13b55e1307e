"""Shutting down by signal: SIGINT lets transactions finish, SIGTERM lets clients finish,
a second SIGINT or SIGTERM, or a SIGQUIT, exits at once; meanwhile the unix socket takes
admin console logins only."""

from __future__ import annotations

import os
import signal
import socket
import threading
from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus

from tests.support import PgtarnProcess, TempCluster

from .conftest import PgtarnFactory
from .drivers import connect
from .pgstat import make_table, rows, wait_for
from .test_admin import admin, pool_row

DEADLINE = 10.0


def backend_alive(pg_cluster: TempCluster, pid: int) -> bool:
    out = pg_cluster.psql(f"SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}")
    return int(out.strip()) > 0


def refuses_connections(proc: PgtarnProcess) -> bool:
    try:
        with connect(proc, autocommit=True, connect_timeout=3):
            return False
    except psycopg.OperationalError:
        return True


def refused_at_connect(proc: PgtarnProcess) -> bool:
    """The listening socket is closed: the TCP connection itself is refused."""
    try:
        with socket.create_connection((proc.host, proc.port), timeout=3):
            return False
    except ConnectionRefusedError:
        return True


def failing_query(conn: psycopg.Connection[Any], sql: str, errors: list[BaseException]) -> None:
    """Run sql (in a thread); keep the error it ends with."""
    try:
        conn.execute(sql)
    except BaseException as exc:
        errors.append(exc)


def shutdown_logged(proc: PgtarnProcess, mode: str) -> bool:
    return f"shutdown requested ({mode})" in proc.log_text()


def exit_code(proc: PgtarnProcess) -> int:
    return proc.proc.wait(DEADLINE)


def over_unix(proc: PgtarnProcess, dbname: str) -> psycopg.Connection:
    """A login through pgtarn's unix socket (as app, an admin user)."""
    return psycopg.connect(
        host=proc.socket_dir,
        port=proc.port,
        user="app",
        password="app_pass",
        dbname=dbname,
        autocommit=True,
        connect_timeout=3,
    )


def closed_without_error(exc: psycopg.OperationalError) -> bool:
    """The connection was closed under the client: no ErrorResponse came first."""
    return exc.sqlstate is None and "server closed the connection unexpectedly" in str(exc)


def test_sigint_lets_a_transaction_under_way_finish(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    table = make_table(pg_cluster, "shut_")
    proc = pgtarn_factory()
    with connect(proc) as a:
        a.execute(f"INSERT INTO {table} VALUES (1)")
        proc.send_signal(signal.SIGINT)
        assert wait_for(lambda: shutdown_logged(proc, "servers")), proc.log_text()
        assert wait_for(lambda: refuses_connections(proc)), "new clients still accepted"
        assert proc.proc.poll() is None  # waits for A's transaction
        a.execute(f"INSERT INTO {table} VALUES (2)")
        a.commit()
        assert exit_code(proc) == 0
    assert rows(pg_cluster, table) == [1, 2]


def test_sigint_gives_waiting_clients_no_server(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    table = make_table(pg_cluster, "shut_")
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    errors: list[BaseException] = []
    with connect(proc) as a, connect(proc, autocommit=True) as b:
        a.execute(f"INSERT INTO {table} VALUES (1)")  # A holds the only server

        def run_b() -> None:
            try:
                b.execute(f"INSERT INTO {table} VALUES (2)")
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=run_b)
        thread.start()
        try:
            # B's query is sent and waits for a server in pgtarn
            assert wait_for(lambda: b.info.transaction_status == TransactionStatus.ACTIVE)
            proc.send_signal(signal.SIGINT)
            assert wait_for(lambda: shutdown_logged(proc, "servers")), proc.log_text()
            # as PgBouncer: a client waiting for a server is disconnected at once
            thread.join(DEADLINE)
            assert not thread.is_alive()
            assert proc.proc.poll() is None  # A's transaction is still waited for
            a.commit()
            assert exit_code(proc) == 0
        finally:
            thread.join(DEADLINE)
        assert not thread.is_alive()
    assert len(errors) == 1, errors
    assert isinstance(errors[0], psycopg.OperationalError), repr(errors[0])
    assert "server shutting down" in str(errors[0]), errors[0]  # PgBouncer's words
    assert "closing because: server shutting down" in proc.log_text()
    assert rows(pg_cluster, table) == [1]  # B's INSERT never ran


def test_sigterm_waits_for_clients_to_leave(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    table = make_table(pg_cluster, "shut_")
    proc = pgtarn_factory()
    with connect(proc, autocommit=True) as a:
        assert a.execute("SELECT 1").fetchone() == (1,)
        proc.send_signal(signal.SIGTERM)
        assert wait_for(lambda: shutdown_logged(proc, "clients")), proc.log_text()
        assert wait_for(lambda: refuses_connections(proc)), "new clients still accepted"
        a.execute("BEGIN")
        a.execute(f"INSERT INTO {table} VALUES (1)")
        a.execute("COMMIT")
        assert a.execute(f"SELECT count(*) FROM {table}").fetchone() == (1,)
        assert proc.proc.poll() is None  # A is still connected
    assert exit_code(proc) == 0
    assert rows(pg_cluster, table) == [1]


def test_second_sigterm_exits_at_once(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory()
    with connect(proc, autocommit=True) as a:
        assert a.execute("SELECT 1").fetchone() == (1,)
        proc.send_signal(signal.SIGTERM)
        assert wait_for(lambda: shutdown_logged(proc, "clients")), proc.log_text()
        assert proc.proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert exit_code(proc) == 0
        # as PgBouncer, which exits: the connection is closed, with no error sent first
        with pytest.raises(psycopg.OperationalError) as closed:
            a.execute("SELECT 1")
        assert closed_without_error(closed.value), closed.value
    assert "got SIGTERM while shutting down, fast exit" in proc.log_text()


def test_sigquit_exits_at_once_mid_transaction(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    table = make_table(pg_cluster, "shut_")
    proc = pgtarn_factory()
    with connect(proc) as a:
        a.execute(f"INSERT INTO {table} VALUES (1)")
        row = a.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        pid = row[0]
        proc.send_signal(signal.SIGQUIT)
        assert exit_code(proc) == 0
        with pytest.raises(psycopg.OperationalError):
            a.execute(f"INSERT INTO {table} VALUES (2)")
    assert wait_for(lambda: not backend_alive(pg_cluster, pid))  # the server was closed
    assert rows(pg_cluster, table) == []  # and its transaction rolled back


@pytest.mark.parametrize("first", [signal.SIGINT, signal.SIGTERM])
def test_sigint_during_a_shutdown_exits_at_once(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster, first: signal.Signals
) -> None:
    table = make_table(pg_cluster, "shut_")
    proc = pgtarn_factory()
    with connect(proc) as a:
        a.execute(f"INSERT INTO {table} VALUES (1)")
        row = a.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        proc.send_signal(first)
        mode = "servers" if first == signal.SIGINT else "clients"
        assert wait_for(lambda: shutdown_logged(proc, mode)), proc.log_text()
        assert proc.proc.poll() is None  # A's transaction is waited for
        proc.send_signal(signal.SIGINT)
        assert exit_code(proc) == 0
        assert shutdown_logged(proc, "now")
        with pytest.raises(psycopg.OperationalError):
            a.execute(f"INSERT INTO {table} VALUES (2)")
    assert wait_for(lambda: not backend_alive(pg_cluster, row[0]))
    assert rows(pg_cluster, table) == []  # the transaction rolled back


def test_after_sigint_new_connections_are_refused_at_connect(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory()
    with connect(proc) as a:
        a.execute("SELECT 1")  # a transaction under way: pgtarn waits for it
        assert not refused_at_connect(proc)
        proc.send_signal(signal.SIGINT)
        assert wait_for(lambda: shutdown_logged(proc, "servers")), proc.log_text()
        assert refused_at_connect(proc)  # not accepted, then answered with an error
        assert proc.proc.poll() is None
        a.commit()
    assert exit_code(proc) == 0


def test_sigusr2_does_not_undo_a_sigint_shutdown(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    table = make_table(pg_cluster, "shut_")
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    with connect(proc) as a, connect(proc, autocommit=True) as b:
        a.execute(f"INSERT INTO {table} VALUES (1)")  # A holds the only server
        proc.send_signal(signal.SIGINT)
        assert wait_for(lambda: shutdown_logged(proc, "servers")), proc.log_text()
        proc.send_signal(signal.SIGUSR2)  # RESUME: refused while shutting down
        assert wait_for(lambda: "got SIGUSR2 while shutting down, ignoring" in proc.log_text())
        assert refused_at_connect(proc)  # still not listening
        errors: list[BaseException] = []
        thread = threading.Thread(
            target=failing_query, args=(b, f"INSERT INTO {table} VALUES (2)", errors)
        )
        thread.start()
        thread.join(DEADLINE)  # no server for new work: B is disconnected
        assert not thread.is_alive()
        assert len(errors) == 1 and "shutting down" in str(errors[0]), errors
        assert proc.proc.poll() is None
        a.execute(f"INSERT INTO {table} VALUES (3)")
        a.commit()
        assert exit_code(proc) == 0
    assert rows(pg_cluster, table) == [1, 3]


def test_shutdown_wait_for_servers_disconnects_paused_clients(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    table = make_table(pg_cluster, "shut_")
    proc = pgtarn_factory()
    errors: list[BaseException] = []
    with connect(proc) as a, connect(proc, autocommit=True) as b, admin(proc) as console:
        a.execute(f"INSERT INTO {table} VALUES (1)")  # A's transaction holds a server
        proc.send_signal(signal.SIGUSR1)  # PAUSE: new work waits for RESUME
        assert wait_for(lambda: dict(console.execute("SHOW STATE").fetchall())["paused"] == "yes")
        thread = threading.Thread(
            target=failing_query, args=(b, f"INSERT INTO {table} VALUES (2)", errors)
        )
        thread.start()
        try:
            assert wait_for(lambda: pool_row(console)["cl_waiting"] == 1)  # B is paused
            assert console.execute("SHUTDOWN WAIT_FOR_SERVERS").statusmessage == "SHUTDOWN"
            thread.join(DEADLINE)  # B is disconnected at once, as PgBouncer does
            assert not thread.is_alive()
            assert proc.proc.poll() is None  # still waiting for A's transaction
            a.execute(f"INSERT INTO {table} VALUES (3)")
            a.commit()
            assert exit_code(proc) == 0
        finally:
            thread.join(DEADLINE)
    assert len(errors) == 1 and isinstance(errors[0], psycopg.OperationalError), errors
    assert "shutting down" in str(errors[0]), errors[0]
    assert rows(pg_cluster, table) == [1, 3]


@pytest.mark.parametrize("stop", ["SIGTERM", "SHUTDOWN WAIT_FOR_CLIENTS"])
def test_while_clients_are_waited_for_the_unix_socket_takes_admin_logins_only(
    pgtarn_factory: PgtarnFactory, stop: str
) -> None:
    proc = pgtarn_factory()
    path = os.path.join(proc.socket_dir, f".s.PGSQL.{proc.port}")
    with connect(proc, autocommit=True) as a:
        assert a.execute("SELECT 1").fetchone() == (1,)
        if stop == "SIGTERM":
            proc.send_signal(signal.SIGTERM)
        else:
            with admin(proc) as console:
                assert console.execute(stop).statusmessage == "SHUTDOWN"
        assert wait_for(lambda: shutdown_logged(proc, "clients")), proc.log_text()
        assert refused_at_connect(proc)  # TCP: closed
        with over_unix(proc, "pgbouncer") as console:  # as PgBouncer: the console still works
            assert console.execute("SHOW VERSION").fetchone() is not None
        with pytest.raises(psycopg.OperationalError, match="pooler is shutting down"):
            over_unix(proc, "app")
        assert proc.proc.poll() is None  # A is still connected
        assert a.execute("SELECT 2").fetchone() == (2,)
    assert exit_code(proc) == 0
    assert not os.path.exists(path)  # gone with the process


def test_while_servers_are_waited_for_the_unix_socket_takes_admin_logins_only(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    table = make_table(pg_cluster, "shut_")
    proc = pgtarn_factory()
    with connect(proc) as a, admin(proc) as console:
        a.execute(f"INSERT INTO {table} VALUES (1)")  # A's transaction holds a server
        assert console.execute("SHUTDOWN WAIT_FOR_SERVERS").statusmessage == "SHUTDOWN"
        assert "SHUTDOWN WAIT_FOR_SERVERS command issued" in proc.log_text()
        assert refused_at_connect(proc)
        with over_unix(proc, "pgbouncer") as unix_console:
            assert unix_console.execute("SHOW VERSION").fetchone() is not None
        with pytest.raises(psycopg.OperationalError, match="pooler is shutting down"):
            over_unix(proc, "app")
        assert proc.proc.poll() is None  # A's transaction is waited for
        a.commit()
        assert exit_code(proc) == 0  # the console's connection does not keep it
    assert rows(pg_cluster, table) == [1]
