"""SQL-level PREPARE / EXECUTE / DEALLOCATE sent as simple queries through transaction pooling."""

from __future__ import annotations

import asyncio
import random

import asyncpg
import psycopg
import pytest

from tests.support import TempCluster

from .conftest import PgtarnFactory
from .drivers import aconnect, connect

SMALL_POOL = {"default_pool_size": 2, "max_client_conn": 200}


def test_prepare_execute_deallocate_across_servers_20_clients(
    pgtarn_factory: PgtarnFactory,
) -> None:
    """Each client prepares its own statement under a name others use too; its EXECUTEs
    land on whichever of the 2 servers is free and return its own rows."""
    proc = pgtarn_factory(settings=SMALL_POOL)

    async def client(n: int) -> int:
        rng = random.Random(n)
        conn = await aconnect(proc)
        checked = 0
        try:
            for round_ in range(4):
                k = n * 10 + round_
                await conn.execute(f"PREPARE q (int) AS SELECT $1 * 1000 + {k}")
                for _ in range(rng.randrange(3, 8)):
                    x = rng.randrange(1000)
                    row = await conn.fetchrow(f"EXECUTE q({x})")
                    assert row is not None and row[0] == x * 1000 + k
                    checked += 1
                    await asyncio.sleep(rng.random() / 200)  # let the servers change hands
                await conn.execute("DEALLOCATE q")
                with pytest.raises(
                    asyncpg.InvalidSQLStatementNameError,
                    match='prepared statement "q" does not exist',
                ):
                    await conn.execute("EXECUTE q(1)")
        finally:
            await conn.close()
        return checked

    async def main() -> list[int]:
        return await asyncio.gather(*(client(n) for n in range(20)))

    assert sum(asyncio.run(main())) >= 20 * 4 * 3


def test_statement_prepared_on_one_server_runs_on_the_other(pgtarn_factory: PgtarnFactory) -> None:
    """The server that ran the PREPARE is held by another client's transaction: the EXECUTE
    runs on the other server, which never saw the PREPARE."""
    proc = pgtarn_factory(settings={"default_pool_size": 2})
    pid = "select pg_backend_pid()"
    with (
        connect(proc, autocommit=True, cursor_factory=psycopg.ClientCursor) as a,
        connect(proc, autocommit=True) as b,
        connect(proc, autocommit=True) as c,
    ):
        a.execute("BEGIN")
        a.execute('PREPARE "Mixed Case" (text) AS SELECT upper($1)')
        prepared_on = a.execute(pid).fetchone()
        a.execute("COMMIT")
        b.execute("BEGIN")
        c.execute("BEGIN")
        holder, other = (b, c) if b.execute(pid).fetchone() == prepared_on else (c, b)
        assert holder.execute(pid).fetchone() == prepared_on
        other.execute("COMMIT")
        for word in ("one", "two", "three"):
            assert a.execute('EXECUTE "Mixed Case"(%s)', (word,)).fetchone() == (word.upper(),)
            assert a.execute(pid).fetchone() != prepared_on
        # EXPLAIN EXECUTE and CREATE TABLE AS EXECUTE name the statement too
        plan = a.execute("EXPLAIN EXECUTE \"Mixed Case\"('x')").fetchall()
        assert plan and "Result" in plan[0][0]
        a.execute("BEGIN")
        a.execute("CREATE TEMP TABLE t_exec AS EXECUTE \"Mixed Case\"('made')")
        assert a.execute("select * from t_exec").fetchall() == [("MADE",)]
        a.execute("ROLLBACK")
        holder.execute("COMMIT")


def test_errors_are_postgresql_s_own_and_name_the_client_s_statement(
    pgtarn_factory: PgtarnFactory,
) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 2})

    async def main() -> None:
        conn = await aconnect(proc)
        try:
            with pytest.raises(
                asyncpg.InvalidSQLStatementNameError,
                match='prepared statement "nope" does not exist',
            ):
                await conn.execute("EXECUTE nope")
            with pytest.raises(
                asyncpg.InvalidSQLStatementNameError,
                match='prepared statement "nope" does not exist',
            ):
                await conn.execute("DEALLOCATE nope")
            await conn.execute("PREPARE twice AS SELECT 1")
            with pytest.raises(
                asyncpg.DuplicatePreparedStatementError,
                match='prepared statement "twice" already exists',
            ):
                await conn.execute("PREPARE twice AS SELECT 2")
            assert await conn.fetchval("EXECUTE twice") == 1
            # a PREPARE that fails leaves no name behind
            with pytest.raises(asyncpg.UndefinedTableError):
                await conn.execute("PREPARE broken AS SELECT * FROM no_such_table")
            with pytest.raises(asyncpg.InvalidSQLStatementNameError):
                await conn.execute("EXECUTE broken")
            await conn.execute("PREPARE broken AS SELECT 'fixed'")
            assert await conn.fetchval("EXECUTE broken") == "fixed"
            # forms that cannot be run safely get a clear error, never a wrong result
            with pytest.raises(
                asyncpg.FeatureNotSupportedError, match="PREPARE must be sent as a query of its own"
            ):
                await conn.execute("PREPARE two AS SELECT 2; SELECT 1")
            # the extended protocol: an unnamed statement may EXECUTE it, a named one not
            assert await conn.fetchval("EXECUTE twice") == 1
            cached = await aconnect(proc, statement_cache_size=10)
            try:
                await cached.execute("PREPARE mine AS SELECT 'mine'")
                with pytest.raises(
                    asyncpg.FeatureNotSupportedError,
                    match="in a named statement through the extended query",
                ):
                    await cached.fetchval("EXECUTE mine")
                with pytest.raises(
                    asyncpg.FeatureNotSupportedError,
                    match="PREPARE of a SQL-level prepared statement through",
                ):
                    await cached.fetchval("PREPARE other AS SELECT 1")
                assert await cached.fetchval("SELECT 'still fine'") == "still fine"
            finally:
                await cached.close()
            # the words inside literals, identifiers and comments are not names
            assert (
                await conn.fetchval(
                    "SELECT 'EXECUTE twice' /* DEALLOCATE twice */ || $$PREPARE x AS$$"
                )
                == "EXECUTE twicePREPARE x AS"
            )
            await conn.execute("DEALLOCATE PREPARE twice")
            with pytest.raises(asyncpg.InvalidSQLStatementNameError):
                await conn.execute("EXECUTE twice")
        finally:
            await conn.close()

    asyncio.run(main())


def test_prepare_inside_a_transaction_and_deallocate_all(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 2})
    with connect(proc, cursor_factory=psycopg.ClientCursor) as conn:
        conn.execute("PREPARE inside (int) AS SELECT $1 + 1")
        assert conn.execute("EXECUTE inside(1)").fetchone() == (2,)
        conn.rollback()  # prepared statements are not transactional
        assert conn.execute("EXECUTE inside(2)").fetchone() == (3,)
        conn.commit()
        # in a failed transaction, EXECUTE fails as PostgreSQL says, and nothing is broken
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("select 1/0")
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            conn.execute("EXECUTE inside(3)")
        conn.rollback()
        assert conn.execute("EXECUTE inside(3)").fetchone() == (4,)
        conn.commit()
        conn.autocommit = True
        conn.execute("DEALLOCATE ALL")
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            conn.execute("EXECUTE inside(4)")
        conn.execute("PREPARE inside (int) AS SELECT $1 + 100")
        assert conn.execute("EXECUTE inside(4)").fetchone() == (104,)


def test_stale_plan_of_a_sql_statement_is_retried(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    pg_cluster.psql(
        "DROP TABLE IF EXISTS sql_shape; CREATE TABLE sql_shape (id int, a int);"
        " INSERT INTO sql_shape VALUES (1, 10); GRANT ALL ON sql_shape TO PUBLIC;",
        dbname="app",
    )
    proc = pgtarn_factory(settings={"default_pool_size": 2})
    with (
        connect(proc, autocommit=True, cursor_factory=psycopg.ClientCursor) as a,
        connect(proc, autocommit=True, cursor_factory=psycopg.ClientCursor) as b,
    ):
        a.execute("PREPARE shape_q (int) AS SELECT * FROM sql_shape WHERE id = $1")
        with b.transaction():  # a's EXECUTEs land on both servers
            b.execute("select 1")
            assert a.execute("EXECUTE shape_q(1)").fetchone() == (1, 10)
        assert a.execute("EXECUTE shape_q(1)").fetchone() == (1, 10)
        pg_cluster.psql("ALTER TABLE sql_shape ADD COLUMN b text DEFAULT 'x'", dbname="app")
        for _ in range(4):
            assert a.execute("EXECUTE shape_q(1)").fetchone() == (1, 10, "x")


def test_execute_on_a_server_that_needs_a_set_first(pgtarn_factory: PgtarnFactory) -> None:
    """Clients with different TimeZones share 2 servers: a server lent to a client gets SET
    in front of its bytes, then pgtarn's own PREPARE, then the EXECUTE; all three replies
    end where they belong."""
    proc = pgtarn_factory(settings={"default_pool_size": 2})

    async def client(n: int) -> list[str]:
        zone = ("UTC", "Asia/Tokyo", "America/New_York")[n % 3]
        conn = await aconnect(proc, server_settings={"TimeZone": zone})
        try:
            await conn.execute(f"PREPARE tz_{n} AS SELECT current_setting('TimeZone') || ':{n}'")
            out = []
            for _ in range(6):
                out.append(await conn.fetchval(f"EXECUTE tz_{n}"))
                await asyncio.sleep(0.002)
            return out
        finally:
            await conn.close()

    async def main() -> list[list[str]]:
        return await asyncio.gather(*(client(n) for n in range(9)))

    for n, values in enumerate(asyncio.run(main())):
        zone = ("UTC", "Asia/Tokyo", "America/New_York")[n % 3]
        assert values == [f"{zone}:{n}"] * 6
