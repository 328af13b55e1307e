"""COPY both ways, extended protocol, pipelines and Flush through transaction pooling."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import asyncpg
import psycopg
import pytest

from pgtarn.proto import build
from tests.support import TempCluster

from .conftest import PgtarnFactory
from .drivers import aconnect, connect
from .rawpg import RawClient


def make_table(pg_cluster: TempCluster) -> str:
    name = "t_" + uuid.uuid4().hex[:10]
    pg_cluster.psql(
        f"CREATE TABLE {name} (id int, v text); ALTER TABLE {name} OWNER TO app", dbname="app"
    )
    return name


def test_copy_from_and_to_stdin(pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster) -> None:
    table = make_table(pg_cluster)
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    rows = [(i, f"row {i} " + "x" * (i % 50)) for i in range(5000)]
    with connect(proc) as conn:
        with conn.cursor() as cur, cur.copy(f"COPY {table} (id, v) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        conn.commit()
        got = []
        copy_out = f"COPY (SELECT id, v FROM {table} ORDER BY id) TO STDOUT"
        with conn.cursor() as cur, cur.copy(copy_out) as copy:
            for row in copy.rows():
                got.append((int(row[0]), row[1]))
        conn.commit()
    assert got == rows
    # a failed COPY leaves the server usable for the next client
    with connect(proc) as conn:
        try:
            with conn.cursor() as cur, cur.copy(f"COPY {table} (id, v) FROM STDIN") as copy:
                copy.write(b"not-a-number\tx\n")
        except psycopg.errors.InvalidTextRepresentation:
            conn.rollback()
    with connect(proc, autocommit=True) as conn:
        assert conn.execute(f"select count(*) from {table}").fetchone() == (5000,)


def test_asyncpg_copy(pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster) -> None:
    table = make_table(pg_cluster)
    proc = pgtarn_factory(settings={"default_pool_size": 1})

    async def scenario() -> int:
        conn = await aconnect(proc)
        await conn.copy_records_to_table(table, records=[(i, str(i)) for i in range(1000)])
        count = await conn.fetchval(f"select count(*) from {table}")
        await conn.close()
        return int(count)

    assert asyncio.run(scenario()) == 1000


def test_psycopg_pipeline_across_transactions(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    table = make_table(pg_cluster)
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    with connect(proc, autocommit=True) as a, connect(proc, autocommit=True) as b:
        with a.pipeline():
            curs = [
                a.execute(f"insert into {table} values (%s, %s) returning id", (i, "p"))
                for i in range(50)
            ]
            sums = a.execute("select sum(id) from generate_series(1, 100) as id")
        assert [c.fetchone() for c in curs] == [(i,) for i in range(50)]
        assert sums.fetchone() == (5050,)
        with b.pipeline():
            with b.transaction():
                b.execute(f"insert into {table} values (%s, %s)", (1000, "tx"))
                b.execute(f"update {table} set v = 'up' where id < 10")
            counted = b.execute(f"select count(*) from {table} where v = 'up'")
        assert counted.fetchone() == (10,)
        assert a.execute(f"select count(*) from {table}").fetchone() == (51,)


def test_asyncpg_prepared_and_executemany(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    """asyncpg runs on the extended protocol with unnamed statements when its cache is off."""
    table = make_table(pg_cluster)
    proc = pgtarn_factory(settings={"default_pool_size": 2})

    async def scenario() -> list[int]:
        conns = [await aconnect(proc) for _ in range(6)]

        async def work(i: int, conn: asyncpg.Connection) -> None:
            await conn.executemany(
                f"insert into {table} values ($1, $2)", [(i * 100 + k, "m") for k in range(20)]
            )
            async with conn.transaction():
                await conn.execute(f"insert into {table} values ($1, 'tx')", i)

        await asyncio.gather(*(work(i, c) for i, c in enumerate(conns)))
        counts = [int(await c.fetchval(f"select count(*) from {table}")) for c in conns]
        for c in conns:
            await c.close()
        return counts

    assert asyncio.run(scenario()) == [126] * 6


def test_extended_batch_with_flush_then_sync(pgtarn_factory: PgtarnFactory) -> None:
    """Parse/Bind/Execute + Flush keeps the server linked until the Sync."""
    proc2 = pgtarn_factory(settings={"default_pool_size": 1, "auth_type": "plain"})
    raw = RawClient(proc2.host, proc2.port)
    try:
        raw.startup(user="app", database="app")
        assert raw.read_message()[0] == "R"
        raw.send(build.message(b"p", b"app_pass\x00"))
        raw.read_until("Z")
        parse = build.message(b"P", b"\x00select 41 + 1\x00\x00\x00")
        bind = build.message(b"B", b"\x00\x00\x00\x00\x00\x00\x00\x00")
        execute = build.message(b"E", b"\x00\x00\x00\x00\x00")
        flush = build.message(b"H")
        raw.send(parse + bind + execute + flush)
        got = [raw.read_message()[0] for _ in range(4)]
        assert got == ["1", "2", "D", "C"]
        # a second client cannot take the server while the first's batch is unsynced
        with psycopg.connect(proc2.dsn("app", "app_pass"), autocommit=True) as other:
            other_pid: list[tuple[Any, ...] | None] = []
            t = threading.Thread(
                target=lambda: other_pid.append(other.execute("select 7").fetchone())
            )
            t.start()
            t.join(0.3)
            assert t.is_alive()
            raw.send(build.SYNC)
            assert raw.read_message() == ("Z", b"I")
            t.join(10)
            assert other_pid == [(7,)]
        raw.send(build.TERMINATE)
    finally:
        raw.close()


@pytest.mark.skipif(psycopg.pq.version() < 180000, reason="libpq 18 asks for protocol 3.2")
@pytest.mark.parametrize("auth_type", ["scram-sha-256", "trust"])
def test_libpq_18_asking_for_protocol_3_2_gets_3_0(
    pgtarn_factory: PgtarnFactory, auth_type: str
) -> None:
    """NegotiateProtocolVersion right after the StartupMessage, as PostgreSQL: libpq 18
    (max_protocol_version=3.2) then speaks 3.0, and its cancel still works."""
    proc = pgtarn_factory(settings={"auth_type": auth_type})
    with connect(proc, autocommit=True, max_protocol_version="3.2") as conn:
        assert conn.execute("select 1").fetchone() == (1,)
        assert conn.info.pgconn.protocol_version == 3
        conn.cancel_safe()
