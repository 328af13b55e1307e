"""A client that vanishes never leaves a server in a transaction."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import uuid

import psycopg

from tests.support import TempCluster

from .conftest import PgtarnFactory
from .drivers import connect
from .pgstat import wait_for


def app_backends(pg_cluster: TempCluster, condition: str) -> int:
    out = pg_cluster.psql(
        f"select count(*) from pg_stat_activity where usename = 'app' and {condition}"
    )
    return int(out.strip())


def test_killed_client_mid_transaction_is_rolled_back(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    table = "t_" + uuid.uuid4().hex[:10]
    pg_cluster.psql(f"CREATE TABLE {table} (v int); ALTER TABLE {table} OWNER TO app", dbname="app")
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    with connect(proc, autocommit=True) as probe:
        pid_before = probe.execute("select pg_backend_pid()").fetchone()
    script = textwrap.dedent(f"""
        import os, signal, psycopg
        conn = psycopg.connect({proc.dsn("app", "app_pass")!r})
        conn.execute("insert into {table} values (1)")
        conn.execute("select pg_advisory_xact_lock(4242)")
        print("in-transaction", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    child = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert child.returncode == -signal.SIGKILL
    assert "in-transaction" in child.stdout
    assert wait_for(lambda: app_backends(pg_cluster, "state like 'idle in transaction%'") == 0)
    with connect(proc, autocommit=True) as conn:
        # the same backend (rolled back, not closed) serves the next client, lock released
        assert conn.execute("select pg_backend_pid()").fetchone() == pid_before
        assert conn.execute("select pg_try_advisory_xact_lock(4242)").fetchone() == (True,)
        assert conn.execute(f"select count(*) from {table}").fetchone() == (0,)


def test_client_gone_mid_query_drops_that_server_only(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 2})
    script = textwrap.dedent(f"""
        import os, signal, threading, psycopg
        conn = psycopg.connect({proc.dsn("app", "app_pass")!r}, autocommit=True)
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
        conn.execute("select pg_sleep(1.5), 'marker-{uuid.uuid4().hex}'")
    """)
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert child.returncode == -signal.SIGKILL
    assert wait_for(lambda: app_backends(pg_cluster, "query like '%marker-%'") == 0)
    with connect(proc, autocommit=True) as conn:
        assert conn.execute("select 1").fetchone() == (1,)


def test_terminate_in_transaction_rolls_back(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    table = "t_" + uuid.uuid4().hex[:10]
    pg_cluster.psql(f"CREATE TABLE {table} (v int); ALTER TABLE {table} OWNER TO app", dbname="app")
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    conn = connect(proc)
    conn.execute(f"insert into {table} values (1)")
    conn.close()  # sends Terminate while in a transaction
    with connect(proc, autocommit=True) as other:
        assert other.execute(f"select count(*) from {table}").fetchone() == (0,)
        assert other.execute("select 1").fetchone() == (1,)
    assert app_backends(pg_cluster, "state like 'idle in transaction%'") == 0


def test_server_terminated_gives_client_an_error(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    conn = connect(proc)
    row = conn.execute("select pg_backend_pid()").fetchone()
    assert row is not None
    pg_cluster.psql(f"select pg_terminate_backend({row[0]})")
    try:
        conn.execute("select 1")
    except psycopg.OperationalError as exc:
        assert exc.sqlstate in (None, "57P01", "08006")
    else:
        raise AssertionError("query on a terminated server succeeded")
    finally:
        conn.close()
    with connect(proc, autocommit=True) as fresh:
        assert fresh.execute("select 1").fetchone() == (1,)


def test_cancel_request_reaches_the_right_backend(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 2})
    with connect(proc, autocommit=True) as victim, connect(proc, autocommit=True) as other:
        import threading

        timer = threading.Timer(0.5, victim.cancel)
        timer.start()
        try:
            victim.execute("select pg_sleep(20)")
        except psycopg.errors.QueryCanceled:
            pass
        else:
            raise AssertionError("the query was not cancelled")
        finally:
            timer.cancel()
        # a cancel for an idle client cancels nothing: other's next query runs normally
        victim.cancel()
        assert other.execute("select 5").fetchone() == (5,)
        assert victim.execute("select 6").fetchone() == (6,)
