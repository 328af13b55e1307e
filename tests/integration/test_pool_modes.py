"""Session, transaction and statement pooling semantics, per database and per user."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import psycopg
import pytest

from tests.support import TempCluster

from .conftest import PgtarnFactory
from .drivers import aconnect, connect
from .pgstat import wait_until


def backend_pid(conn: psycopg.Connection) -> int:
    row = conn.execute("select pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def make_table(pg_cluster: TempCluster) -> str:
    name = "t_" + uuid.uuid4().hex[:10]
    pg_cluster.psql(f"CREATE TABLE {name} (v int); ALTER TABLE {name} OWNER TO app", dbname="app")
    return name


def test_transaction_mode_two_clients_share_one_server(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    """pool_size=1: both clients run on the same backend, one transaction at a time."""
    table = make_table(pg_cluster)
    proc = pgtarn_factory(settings={"default_pool_size": 1})

    async def scenario() -> list[int]:
        a = await aconnect(proc)
        b = await aconnect(proc)
        pid_a = await a.fetchval("select pg_backend_pid()")
        pid_b = await b.fetchval("select pg_backend_pid()")
        assert pid_a == pid_b
        tx = a.transaction()
        await tx.start()
        await a.execute(f"insert into {table} values (1)")
        # b's query needs the only server, held by a's open transaction: it can only run
        # after a commits, so it must see a's row.
        b_count = asyncio.ensure_future(b.fetchval(f"select count(*) from {table}"))
        await asyncio.sleep(0.2)
        assert not b_count.done()
        await a.execute(f"insert into {table} values (2)")
        await tx.commit()
        counts = [await b_count]
        # and the other way round
        tx_b = b.transaction()
        await tx_b.start()
        await b.execute(f"insert into {table} values (3)")
        a_count = asyncio.ensure_future(a.fetchval(f"select count(*) from {table}"))
        await b.execute(f"insert into {table} values (4)")
        await tx_b.commit()
        counts.append(await a_count)
        await a.close()
        await b.close()
        return counts

    assert asyncio.run(scenario()) == [2, 4]


def test_transaction_mode_rollback_and_failed_transaction(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    table = make_table(pg_cluster)
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    with connect(proc) as a, connect(proc, autocommit=True) as b:
        a.execute(f"insert into {table} values (1)")
        with pytest.raises(psycopg.errors.DivisionByZero):
            a.execute("select 1/0")
        # a is in a failed transaction and keeps its server; b waits until a rolls back
        a.rollback()
        assert b.execute(f"select count(*) from {table}").fetchone() == (0,)
        assert a.execute("select 1").fetchone() == (1,)
        a.commit()


def test_session_mode_keeps_the_server_and_resets_it(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"pool_mode": "session", "default_pool_size": 1})
    with connect(proc) as conn:
        conn.execute("create temp table tmp_session (v int)")
        conn.commit()
        conn.execute("insert into tmp_session values (42)")
        conn.commit()
        pid = backend_pid(conn)
        conn.execute("set work_mem = '7MB'")
        conn.commit()
        assert conn.execute("select v from tmp_session").fetchone() == (42,)
        assert backend_pid(conn) == pid
    with connect(proc) as conn:
        # same backend (pool_size=1), but DISCARD ALL removed the temp table and the SET
        assert backend_pid(conn) == pid
        assert conn.execute("show work_mem").fetchone() != ("7MB",)
        with pytest.raises(psycopg.errors.UndefinedTable):
            conn.execute("select v from tmp_session")


#: What statement mode answers a transaction block with, closing the client (PgBouncer's words).
REFUSED = "transaction blocks not allowed in statement pooling mode"


def refused_begin(conn: psycopg.Connection[Any], sql: str, **kw: Any) -> None:
    """sql opens a transaction block: the client is closed with PgBouncer's words."""
    with pytest.raises(psycopg.OperationalError, match=REFUSED) as info:
        conn.execute(sql, **kw)
    assert info.value.sqlstate == "08P01"
    assert conn.closed


def test_statement_mode_refuses_transactions(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    table = make_table(pg_cluster)
    proc = pgtarn_factory(settings={"pool_mode": "statement", "default_pool_size": 1})
    with connect(proc, autocommit=True) as conn:
        conn.execute(f"insert into {table} values (1)")
        assert conn.execute(f"select count(*) from {table}").fetchone() == (1,)
        refused_begin(conn, "begin")
    with connect(proc) as conn:  # psycopg's implicit BEGIN
        refused_begin(conn, f"insert into {table} values (2)")
    with connect(proc, autocommit=True) as conn:  # START TRANSACTION as a Parse
        refused_begin(conn, "/* x */ start transaction", prepare=True)
    assert pg_cluster.psql(f"select count(*) from {table}", dbname="app").strip() == "1"
    wait_until(lambda: "closing because: " + REFUSED in proc.log_text())
    with connect(proc, autocommit=True) as conn:  # the pool's server is there, unharmed
        assert conn.execute("select 1").fetchone() == (1,)


def test_pool_mode_per_database_and_per_user(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    base = f"host={pg_cluster.host} port={pg_cluster.port} dbname=app"
    proc = pgtarn_factory(
        settings={"pool_mode": "transaction"},
        databases={"app": base, "app_stmt": f"{base} pool_mode=statement"},
        users={"scram_user": "pool_mode=statement"},
    )
    with connect(proc, autocommit=True) as conn:
        conn.execute("begin")
        conn.execute("commit")
    with connect(proc, dbname="app_stmt", autocommit=True) as conn:
        refused_begin(conn, "begin")
    with connect(proc, user="scram_user", password="scram_pass", autocommit=True) as conn:
        refused_begin(conn, "begin")


def test_pool_size_limits_servers(pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 2})

    async def scenario() -> set[int]:
        conns = [await aconnect(proc) for _ in range(8)]
        pids: set[int] = set()
        for _ in range(3):
            results = await asyncio.gather(
                *(c.fetchval("select pg_backend_pid() from pg_sleep(0.05)") for c in conns)
            )
            pids.update(results)
        for c in conns:
            await c.close()
        return pids

    pids = asyncio.run(scenario())
    assert 1 <= len(pids) <= 2


def test_max_client_conn_refuses_only_the_extra_client(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"max_client_conn": 2})
    with connect(proc, autocommit=True) as a, connect(proc, autocommit=True) as b:
        with pytest.raises(
            psycopg.OperationalError, match=r"no more connections allowed \(max_client_conn\)"
        ):
            connect(proc)
        assert a.execute("select 1").fetchone() == (1,)
        assert b.execute("select 2").fetchone() == (2,)
    # room again once pgtarn has seen them leave
    deadline = time.monotonic() + 10
    while True:
        try:
            with connect(proc, autocommit=True) as c:
                assert c.execute("select 3").fetchone() == (3,)
            break
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
