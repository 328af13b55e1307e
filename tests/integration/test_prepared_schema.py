"""Shared prepared statements across schema changes: never a stale type, never a wrong value."""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Callable

import asyncpg
import psycopg
import pytest

from pgtarn.proto import build
from tests.support import PgtarnProcess, TempCluster

from .conftest import PgtarnFactory
from .drivers import aconnect, connect
from .test_timeouts import raw_login

UTC = datetime.UTC
INSERT_TS = "INSERT INTO ts_t (id, ts) VALUES (%s, %s)"
WITH_OFFSET = "2024-01-01 00:00:00+05"
RIGHT = datetime.datetime(2023, 12, 31, 19, 0, tzinfo=UTC)


def _admin(proc: PgtarnProcess, command: str) -> None:
    with psycopg.connect(proc.dsn("app", "app_pass", dbname="pgbouncer"), autocommit=True) as admin:
        admin.execute(command)


def _ts_table(pg_cluster: TempCluster) -> None:
    pg_cluster.psql(
        "DROP TABLE IF EXISTS ts_t; CREATE TABLE ts_t (id int, ts timestamp);"
        " ALTER TABLE ts_t OWNER TO app;",
        dbname="app",
    )


def _insert_after_migration(
    proc: PgtarnProcess, migrate: Callable[[], object], check: Callable[[], object] | None = None
) -> datetime.datetime:
    """A client prepares the INSERT (its timestamp sent as unknown), migrate() turns the
    column into timestamptz, a connection opened after it inserts a value with an offset
    (check(), if given, runs while both clients are still there)."""
    with connect(proc, autocommit=True) as before:
        before.execute(INSERT_TS, (1, "2020-01-01 00:00:00"), prepare=True)
        migrate()
        with connect(proc, autocommit=True) as after:
            after.execute("SET TimeZone = 'UTC'")
            after.execute(INSERT_TS, (2, WITH_OFFSET), prepare=True)
            row = after.execute("SELECT ts FROM ts_t WHERE id = 2").fetchone()
            assert row is not None
            if check is not None:
                check()
            assert isinstance(row[0], datetime.datetime), row
            return row[0]


def test_a_migration_through_pgtarn_makes_the_next_parse_fresh(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    _ts_table(pg_cluster)
    proc = pgtarn_factory(settings={"default_pool_size": 1})

    def migrate() -> None:
        with connect(proc, autocommit=True) as conn:
            conn.execute("ALTER TABLE ts_t ALTER COLUMN ts TYPE timestamptz")

    assert _insert_after_migration(proc, migrate) == RIGHT


def test_a_migration_in_a_do_block_through_pgtarn(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    _ts_table(pg_cluster)
    proc = pgtarn_factory(settings={"default_pool_size": 1})

    async def migrate_async() -> None:
        conn = await aconnect(proc)  # asyncpg's execute: the simple query protocol
        try:
            await conn.execute(
                "DO $$BEGIN ALTER TABLE ts_t ALTER COLUMN ts TYPE timestamptz; END$$"
            )
        finally:
            await conn.close()

    assert _insert_after_migration(proc, lambda: asyncio.run(migrate_async())) == RIGHT


def test_a_migration_on_a_direct_connection_then_renew_statements(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    _ts_table(pg_cluster)
    proc = pgtarn_factory(settings={"default_pool_size": 1})

    def migrate() -> None:
        pg_cluster.psql("ALTER TABLE ts_t ALTER COLUMN ts TYPE timestamptz", dbname="app")
        _admin(proc, "RENEW_STATEMENTS app")

    def check() -> None:
        with psycopg.connect(
            proc.dsn("app", "app_pass", dbname="pgbouncer"), autocommit=True
        ) as admin:
            cur = admin.execute("SHOW PREPARED_STATEMENTS")
            columns = [c.name for c in cur.description or ()]
            rows = [dict(zip(columns, row, strict=True)) for row in cur.fetchall()]
        inserts = [r for r in rows if r["query"].startswith("INSERT INTO ts_t")]
        # the first client's, renamed, and the second client's, new: both of generation 1
        assert sorted((r["generation"], r["renewals"]) for r in inserts) == [(1, 0), (1, 1)]

    assert _insert_after_migration(proc, migrate, check) == RIGHT


def test_enum_made_in_a_rolled_back_transaction_then_made_again(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    """psycopg's own recovery: the statement failed, the schema is made again, and psycopg
    prepares the same text under a new name: it must be parsed again, on every server."""
    pg_cluster.psql("DROP TABLE IF EXISTS moods; DROP TYPE IF EXISTS mood;", dbname="app")
    proc = pgtarn_factory(settings={"default_pool_size": 2})
    insert = "INSERT INTO moods (m) VALUES (%s)"
    with connect(proc) as conn:
        conn.execute("CREATE TYPE mood AS ENUM ('happy', 'sad')")
        conn.execute("CREATE TABLE moods (m mood)")
        with pytest.raises(psycopg.errors.InvalidTextRepresentation):
            conn.execute(insert, ("angry",), prepare=True)
        conn.rollback()
        conn.execute("CREATE TYPE mood AS ENUM ('happy', 'sad')")
        conn.execute("CREATE TABLE moods (m mood)")
        conn.commit()
        for _ in range(3):
            conn.execute(insert, ("happy",), prepare=True)
            conn.commit()
        with connect(proc, autocommit=True) as other:  # a new connection, another server
            other.execute(insert, ("sad",), prepare=True)
        assert conn.execute("SELECT count(*) FROM moods").fetchone() == (4,)


async def _b_three_times(conn: asyncpg.Connection, query: str) -> list[object]:
    """Column b of query's first row, three times through asyncpg's statement cache; "error"
    for PostgreSQL's stale-statement error (asyncpg prepares again after it)."""
    seen: list[object] = []
    for _ in range(3):
        try:
            seen.append((await conn.fetch(query))[0]["b"])
        except asyncpg.exceptions.InvalidCachedStatementError:
            seen.append("error")
    return seen


@pytest.mark.parametrize("via", ["pgtarn", "direct"])
@pytest.mark.parametrize(("new_type", "expected"), [("real", 2.0), ("bigint", 2), ("text", "2")])
def test_asyncpg_reads_after_a_column_type_change(
    pgtarn_factory: PgtarnFactory,
    pg_cluster: TempCluster,
    new_type: str,
    expected: object,
    via: str,
) -> None:
    """asyncpg binds a cached statement without describing it again: it must get
    PostgreSQL's error (and prepare again by itself), never rows of another shape."""
    pg_cluster.psql(
        "DROP TABLE IF EXISTS shape_t; CREATE TABLE shape_t (a int, b int);"
        " INSERT INTO shape_t VALUES (1, 2); ALTER TABLE shape_t OWNER TO app;",
        dbname="app",
    )
    proc = pgtarn_factory(settings={"default_pool_size": 1})

    async def main() -> list[object]:
        conn = await aconnect(proc, statement_cache_size=100)
        try:
            assert [tuple(r) for r in await conn.fetch("SELECT a, b FROM shape_t")] == [(1, 2)]
            alter = f"ALTER TABLE shape_t ALTER COLUMN b TYPE {new_type}"
            if via == "pgtarn":
                await conn.execute(alter)
            else:
                pg_cluster.psql(alter, dbname="app")
            return await _b_three_times(conn, "SELECT a, b FROM shape_t")
        finally:
            await conn.close()

    seen = asyncio.run(main())
    assert set(seen) <= {expected, "error"} and seen[-1] == expected, seen


def test_asyncpg_new_connection_after_a_column_type_change(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    pg_cluster.psql(
        "DROP TABLE IF EXISTS addr_t; CREATE TABLE addr_t (id int, c inet);"
        " ALTER TABLE addr_t OWNER TO app;",
        dbname="app",
    )
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    insert = "INSERT INTO addr_t (id, c) VALUES ($1, $2)"

    async def main() -> None:
        first = await aconnect(proc, statement_cache_size=100)  # it keeps the statement
        try:
            await first.execute(insert, 1, "10.0.0.1")
            await first.execute("DELETE FROM addr_t")
            await first.execute("ALTER TABLE addr_t ALTER COLUMN c TYPE macaddr USING NULL")
            second = await aconnect(proc, statement_cache_size=100)
            try:
                await second.execute(insert, 2, "08:00:2b:01:02:03")
                assert (
                    await second.fetchval("SELECT c::text FROM addr_t WHERE id = 2")
                    == "08:00:2b:01:02:03"
                )
            finally:
                await second.close()
        finally:
            await first.close()

    asyncio.run(main())


@pytest.mark.parametrize(("new_type", "expected"), [("real", 2.0), ("bigint", 2), ("text", "2")])
def test_asyncpg_statement_prepared_afresh_on_another_server(
    pgtarn_factory: PgtarnFactory,
    pg_cluster: TempCluster,
    new_type: str,
    expected: object,
) -> None:
    """X prepared its statement on the first server; a migration changes its result type
    while Y holds that server; X's cached statement is prepared afresh on the second server,
    whose rows X would decode with the old description: it gets PostgreSQL's error (and
    prepares again by itself), as on the backend where it prepared the statement."""
    pg_cluster.psql(
        "DROP TABLE IF EXISTS other_t; CREATE TABLE other_t (a int, b int);"
        " INSERT INTO other_t VALUES (1, 2); ALTER TABLE other_t OWNER TO app;",
        dbname="app",
    )
    proc = pgtarn_factory(settings={"default_pool_size": 2})

    async def main() -> list[object]:
        x = await aconnect(proc, statement_cache_size=100)
        y = await aconnect(proc)
        try:
            assert [tuple(r) for r in await x.fetch("SELECT * FROM other_t")] == [(1, 2)]
            holder = y.transaction()
            await holder.start()
            await y.execute("SELECT 1")  # y keeps the first server
            pg_cluster.psql(f"ALTER TABLE other_t ALTER COLUMN b TYPE {new_type}", dbname="app")
            seen = await _b_three_times(x, "SELECT * FROM other_t")
            await holder.rollback()
            return seen
        finally:
            await x.close()
            await y.close()

    seen = asyncio.run(main())
    assert set(seen) <= {expected, "error"} and seen[-1] == expected, seen


def test_asyncpg_statements_checked_on_new_servers_run_unchanged(
    pgtarn_factory: PgtarnFactory,
) -> None:
    """Without a schema change the check passes: many clients, few servers, no error."""
    proc = pgtarn_factory(settings={"default_pool_size": 3, "max_client_conn": 100})

    async def client(n: int) -> list[object]:
        conn = await aconnect(proc, statement_cache_size=100)
        try:
            out: list[object] = []
            for i in range(10):
                out.append(await conn.fetchval("SELECT $1::int * 10 + $2::int", n, i))
                out.append(await conn.fetchval("SELECT name FROM items WHERE id = $1", i % 3 + 1))
                await conn.executemany("SELECT $1::int", [(1,), (2,)])
            return out
        finally:
            await conn.close()

    async def main() -> list[list[object]]:
        return await asyncio.gather(*(client(n) for n in range(12)))

    names = {1: "one", 2: "two", 3: "three"}
    for n, values in enumerate(asyncio.run(main())):
        assert values == [v for i in range(10) for v in (n * 10 + i, names[i % 3 + 1])]


EVENT_TRIGGER = """
CREATE OR REPLACE FUNCTION pgtarn_schema_changed() RETURNS event_trigger LANGUAGE plpgsql
    AS $$BEGIN PERFORM pg_notify('pgtarn_schema', tg_tag); END$$;
CREATE EVENT TRIGGER pgtarn_schema_changed ON ddl_command_end
    EXECUTE FUNCTION pgtarn_schema_changed();
"""


def _generation(proc: PgtarnProcess) -> int:
    with psycopg.connect(proc.dsn("app", "app_pass", dbname="pgbouncer"), autocommit=True) as admin:
        cur = admin.execute("SHOW PREPARED_STATEMENTS")
        columns = [c.name for c in cur.description or ()]
        generations = [dict(zip(columns, row, strict=True))["generation"] for row in cur.fetchall()]
    return max(generations, default=-1)


def test_a_migration_outside_pgtarn_heard_through_an_event_trigger(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    _ts_table(pg_cluster)
    pg_cluster.psql(EVENT_TRIGGER, dbname="app")
    try:
        proc = pgtarn_factory(
            settings={"default_pool_size": 1, "schema_change_channel": "pgtarn_schema"}
        )

        def migrate() -> None:
            before = _generation(proc)
            pg_cluster.psql("ALTER TABLE ts_t ALTER COLUMN ts TYPE timestamptz", dbname="app")
            deadline = time.monotonic() + 20
            while _generation(proc) <= before:  # the notification comes asynchronously
                assert time.monotonic() < deadline, "no schema change heard"
                time.sleep(0.05)

        assert _insert_after_migration(proc, migrate) == RIGHT
    finally:
        pg_cluster.psql(
            "DROP EVENT TRIGGER pgtarn_schema_changed; DROP FUNCTION pgtarn_schema_changed();",
            dbname="app",
        )


def test_asyncpg_after_a_type_dropped_and_made_again(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    """A statement whose parameter names a type that no longer exists: asyncpg cannot
    resolve it (6 attempts, then an error, on every new connection). A raw client keeps the
    shared statement alive meanwhile (an asyncpg client that introspected a type would be
    pinned by its set_config). After the migration through pgtarn, a new connection's Parse
    is fresh, as on a direct connection."""
    make = (
        "CREATE TYPE colour AS ENUM ('red', 'blue'); CREATE TABLE paint (c colour);"
        " ALTER TABLE paint OWNER TO app; ALTER TYPE colour OWNER TO app;"
    )
    pg_cluster.psql("DROP TABLE IF EXISTS paint; DROP TYPE IF EXISTS colour; " + make, dbname="app")
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    insert = "INSERT INTO paint (c) VALUES ($1)"
    holder = raw_login(proc)
    try:
        holder.send(
            build.message(b"P", b"held\x00" + insert.encode() + b"\x00\x00\x00")
            + build.message(b"S")
        )
        assert [t for t, _ in holder.read_until("Z")] == ["1", "Z"]
        with connect(proc, autocommit=True) as migration:  # the migration, through pgtarn
            migration.execute("DROP TABLE paint; DROP TYPE colour; " + make)

        async def main() -> None:
            conn = await aconnect(proc, statement_cache_size=100)
            try:
                await conn.execute(insert, "blue")
                assert await conn.fetchval("SELECT c::text FROM paint") == "blue"
            finally:
                await conn.close()

        asyncio.run(main())
    finally:
        holder.close()
