"""Shutting down by signal: SIGINT lets transactions finish, SIGTERM lets clients finish,
a second SIGTERM or a SIGQUIT exits at once."""

from __future__ import annotations

import signal
import threading

import psycopg
import pytest
from psycopg.pq import TransactionStatus

from .drivers import connect
from .pgstat import make_table, rows, wait_for

DEADLINE = 10.0





def backend_alive(pg_cluster, pid: int) -> bool:  # type: ignore[no-untyped-def]
    out = pg_cluster.psql(f"SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}")
    return int(out.strip()) > 0


def refuses_connections(proc) -> bool:  # type: ignore[no-untyped-def]
    try:
        with connect(proc, autocommit=True, connect_timeout=3):
            return False
    except psycopg.OperationalError:
        return True


def shutdown_logged(proc, mode: str) -> bool:  # type: ignore[no-untyped-def]
    return f"shutdown requested ({mode})" in proc.log_text()


def exit_code(proc) -> int:  # type: ignore[no-untyped-def]
    return proc.proc.wait(DEADLINE)  # type: ignore[no-any-return]


def test_sigint_lets_a_transaction_under_way_finish(pgtarn_factory, pg_cluster):  # type: ignore[no-untyped-def]
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


def test_sigint_gives_waiting_clients_no_server(pgtarn_factory, pg_cluster):  # type: ignore[no-untyped-def]
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
            assert thread.is_alive()  # still waiting: pools are paused
            a.commit()
            assert exit_code(proc) == 0
        finally:
            thread.join(DEADLINE)
        assert not thread.is_alive()
    assert len(errors) == 1, errors
    assert isinstance(errors[0], psycopg.OperationalError), repr(errors[0])
    message = str(errors[0]).lower()
    assert "shutting down" in message or "closed" in message, message
    assert rows(pg_cluster, table) == [1]  # B's INSERT never ran


def test_sigterm_waits_for_clients_to_leave(pgtarn_factory, pg_cluster):  # type: ignore[no-untyped-def]
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


def test_second_sigterm_exits_at_once(pgtarn_factory):  # type: ignore[no-untyped-def]
    proc = pgtarn_factory()
    with connect(proc, autocommit=True) as a:
        assert a.execute("SELECT 1").fetchone() == (1,)
        proc.send_signal(signal.SIGTERM)
        assert wait_for(lambda: shutdown_logged(proc, "clients")), proc.log_text()
        assert proc.proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert exit_code(proc) == 0
        with pytest.raises(psycopg.OperationalError):
            a.execute("SELECT 1")


def test_sigquit_exits_at_once_mid_transaction(pgtarn_factory, pg_cluster):  # type: ignore[no-untyped-def]
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
