"""Named prepared statements through transaction pooling, with real drivers and pgbench."""

from __future__ import annotations

import asyncio
import random
import shutil
import subprocess

import asyncpg
import psycopg
import pytest

from pgtarn.proto import build
from tests.support import PgtarnProcess, TempCluster

from .conftest import PgtarnFactory
from .drivers import aconnect, connect
from .pgstat import make_table
from .rawpg import RawClient, error_fields
from .test_pool_modes import refused_begin
from .test_timeouts import raw_login

SMALL_POOL = {"default_pool_size": 2, "max_client_conn": 200}


def prepared_every_execute(proc: PgtarnProcess, clients: int, executes: int) -> None:
    """`clients` psycopg clients at once, each preparing every statement (prepare_threshold
    = 0) and running the same one `executes` times with its own parameters: every answer is
    the client's own."""

    async def client(n: int) -> list[tuple[int, str]]:
        async with await psycopg.AsyncConnection.connect(
            proc.dsn("app", "app_pass"), autocommit=True, prepare_threshold=0
        ) as conn:
            out = []
            for i in range(executes):
                cur = await conn.execute(
                    "select %s::int + %s::int, name from items where id = %s::int",
                    (n, i, i % 3 + 1),
                )
                row = await cur.fetchone()
                assert row is not None
                out.append(row)
            return out

    async def main() -> list[list[tuple[int, str]]]:
        return await asyncio.gather(*(client(n) for n in range(clients)))

    names = {1: "one", 2: "two", 3: "three"}
    for n, rows in enumerate(asyncio.run(main())):
        assert rows == [(n + i, names[i % 3 + 1]) for i in range(executes)]


def test_psycopg_prepared_on_every_execute_20_clients_2_servers(
    pgtarn_factory: PgtarnFactory,
) -> None:
    prepared_every_execute(pgtarn_factory(settings=SMALL_POOL), clients=20, executes=15)


def test_asyncpg_default_statement_cache_20_clients_2_servers(
    pgtarn_factory: PgtarnFactory,
) -> None:
    proc = pgtarn_factory(settings=SMALL_POOL)

    async def client(n: int) -> list[int]:
        conn = await aconnect(proc, statement_cache_size=100)
        try:
            out = []
            for i in range(15):
                out.append(await conn.fetchval("select $1::int * 10 + $2::int", n, i))
                if i % 5 == 0:
                    stmt = await conn.prepare("select $1::text || '-' || $2::text")
                    assert await stmt.fetchval(str(n), str(i)) == f"{n}-{i}"
            return out
        finally:
            await conn.close()

    async def main() -> list[list[int]]:
        return await asyncio.gather(*(client(n) for n in range(20)))

    for n, values in enumerate(asyncio.run(main())):
        assert values == [n * 10 + i for i in range(15)]


def test_failed_parse_leaves_no_broken_name(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings=SMALL_POOL)

    async def main() -> None:
        conn = await aconnect(proc, statement_cache_size=100)
        try:
            with pytest.raises(asyncpg.PostgresSyntaxError):
                await conn.prepare("select from where")
            with pytest.raises(asyncpg.UndefinedTableError):
                await conn.fetchval("select count(*) from no_such_table")
            assert await conn.fetchval("select $1::int + 1", 41) == 42
            # the same text again, once it can work
            stmt = await conn.prepare("select count(*) from items")
            assert await stmt.fetchval() == 3
        finally:
            await conn.close()

    asyncio.run(main())


def test_unnamed_statements_in_a_pipeline_return_their_own_rows(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    pg_cluster.psql(
        "DROP TABLE IF EXISTS other_items; CREATE TABLE other_items (id int, v text);"
        " INSERT INTO other_items VALUES (1, 'other');"
        " GRANT ALL ON other_items TO PUBLIC;",
        dbname="app",
    )
    proc = pgtarn_factory(settings=SMALL_POOL)
    with (
        connect(proc, autocommit=True, prepare_threshold=None) as a,
        connect(proc, autocommit=True, prepare_threshold=0) as b,
    ):
        for _ in range(5):
            with a.pipeline():
                c1 = a.execute("select name from items where id = %s", (1,))
                c2 = a.execute("select v from other_items where id = %s", (1,))
                c3 = b.execute("select v from other_items where id = %s", (1,))
                c4 = b.execute("select name from items where id = %s", (2,))
            assert c1.fetchall() == [("one",)]
            assert c2.fetchall() == [("other",)]
            assert c3.fetchall() == [("other",)]
            assert c4.fetchall() == [("two",)]


def test_deallocate_all_and_discard_all(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 1})

    async def main() -> None:
        conn = await aconnect(proc, statement_cache_size=0)
        try:
            stmt = await conn.prepare("select 7")
            assert await stmt.fetchval() == 7
            await conn.execute("DEALLOCATE ALL")
            # asyncpg prepares it again by itself, as it does against PostgreSQL
            assert await stmt.fetchval() == 7
            stmt = await conn.prepare("select 8")
            assert await stmt.fetchval() == 8
            await conn.execute("DISCARD ALL")
            stmt = await conn.prepare("select 9")
            assert await stmt.fetchval() == 9
        finally:
            await conn.close()

    asyncio.run(main())


def test_randomized_clients_prepare_execute_close_reprepare(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 2, "max_prepared_statements": 3})
    texts = [f"select $1::int + {k}" for k in range(6)]

    async def client(seed: int) -> int:
        rng = random.Random(seed)
        conn = await aconnect(proc, statement_cache_size=0)
        checked = 0
        try:
            prepared: dict[int, asyncpg.prepared_stmt.PreparedStatement] = {}
            for i in range(40):
                k = rng.randrange(len(texts))
                action = rng.random()
                if k not in prepared or action < 0.2:
                    # named statements: several clients share each text, with other names
                    prepared[k] = await conn.prepare(texts[k], name=f"c{seed}_{k}_{i}")
                x = rng.randrange(1000)
                assert await prepared[k].fetchval(x) == x + k
                checked += 1
                if action > 0.85:
                    del prepared[k]  # asyncpg closes it (Close) once unreferenced
        finally:
            await conn.close()
        return checked

    async def main() -> list[int]:
        return await asyncio.gather(*(client(seed) for seed in range(20)))

    assert sum(asyncio.run(main())) == 20 * 40


@pytest.mark.skipif(shutil.which("pgbench") is None, reason="pgbench not installed")
@pytest.mark.parametrize("mode", ["prepared", "extended"])
def test_pgbench_100_clients(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster, mode: str
) -> None:
    subprocess.run(
        ["pgbench", "-i", "-s", "1", "-q", pg_cluster.dsn("app", "app_pass", dbname="app")],
        check=True,
        capture_output=True,
        timeout=120,
    )
    proc = pgtarn_factory(settings={"default_pool_size": 5, "max_client_conn": 200})
    result = subprocess.run(
        # -S: pgbench prepares each statement with a blocking PQprepare the first time, so a
        # multi-statement script (TPC-B) can deadlock its own threads behind a pool smaller
        # than the client count, with any transaction pooler
        [
            "pgbench",
            "-n",
            "-S",
            "-c",
            "100",
            "-j",
            "2",
            "-t",
            "30",
            "-M",
            mode,
            proc.dsn("app", "app_pass"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "number of transactions actually processed: 3000/3000" in result.stdout
    assert "number of failed transactions: 0" in result.stdout


@pytest.mark.parametrize("mode", ["session", "transaction"])
def test_server_side_names_rewritten_only_in_transaction_mode(
    pgtarn_factory: PgtarnFactory, mode: str
) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 1, "pool_mode": mode})

    async def main() -> set[str]:
        conn = await aconnect(proc, statement_cache_size=0)
        try:
            stmt = await conn.prepare("select 11", name="my_stmt")
            assert await stmt.fetchval() == 11
            rows = await conn.fetch("select name from pg_prepared_statements")
            return {r["name"] for r in rows} | {"client:" + stmt.get_name()}
        finally:
            await conn.close()

    names = asyncio.run(main())
    client_name = next(n[len("client:") :] for n in names if n.startswith("client:"))
    server_names = {n for n in names if not n.startswith("client:")}
    if mode == "session":
        assert client_name in server_names  # the client's own server, its own names
    else:
        assert client_name not in server_names
        assert any(n.startswith("pgtarn_") for n in server_names)


def _shape_table(pg_cluster: TempCluster) -> None:
    pg_cluster.psql(
        "DROP TABLE IF EXISTS shape; CREATE TABLE shape (id int, a int);"
        " INSERT INTO shape VALUES (1, 10); GRANT ALL ON shape TO PUBLIC;",
        dbname="app",
    )


def test_result_type_change_is_retried_transparently(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    """The statement is the first of its implicit transaction: re-prepared and run again,
    the client never sees 'cached plan must not change result type'."""
    _shape_table(pg_cluster)
    proc = pgtarn_factory(settings={"default_pool_size": 2})
    query = "select * from shape where id = %s"
    with (
        connect(proc, autocommit=True, prepare_threshold=0) as a,
        connect(proc, autocommit=True, prepare_threshold=0) as b,
    ):
        for conn in (a, b):  # both servers get the statement
            with conn.pipeline():
                for _ in range(3):
                    conn.execute(query, (1,))
        assert a.execute(query, (1,)).fetchone() == (1, 10)
        pg_cluster.psql("ALTER TABLE shape ADD COLUMN b text DEFAULT 'x'", dbname="app")
        for _ in range(4):  # on both servers, through both clients: no error at all
            assert a.execute(query, (1,)).fetchone() == (1, 10, "x")
            assert b.execute(query, (1,)).fetchone() == (1, 10, "x")


def test_result_type_change_inside_a_transaction_fails_once_then_works(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    """Something of the transaction already ran: the error goes to the client (as from
    PostgreSQL), and the statement is prepared afresh for the next attempt."""
    _shape_table(pg_cluster)
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    query = "select * from shape where id = %s"
    with connect(proc, prepare_threshold=0) as conn:
        assert conn.execute(query, (1,)).fetchone() == (1, 10)
        conn.commit()
        pg_cluster.psql("ALTER TABLE shape ADD COLUMN b text DEFAULT 'x'", dbname="app")
        conn.execute("select 1")  # the transaction has begun and done work
        with pytest.raises(
            psycopg.errors.FeatureNotSupported, match="cached plan must not change result type"
        ):
            conn.execute(query, (1,))
        conn.rollback()
        assert conn.execute(query, (1,)).fetchone() == (1, 10, "x")
        conn.commit()


def test_statements_tracked_from_a_parse_split_across_packets(
    pgtarn_factory: PgtarnFactory,
) -> None:
    """A client that starts with simple queries, then sends a named Parse whose first bytes
    arrive alone: tracking starts there and nothing of it reaches a server unrewritten."""
    import time

    from pgtarn.proto import build

    from .rawpg import AsyncRawClient

    proc = pgtarn_factory(settings={"default_pool_size": 2, "auth_type": "md5"})

    async def login() -> tuple[int, int]:
        c = await AsyncRawClient.connect(proc.host, proc.port, "app", "app_pass", "app")
        await c.close()
        return c.backend_key

    asyncio.run(login())  # the pool knows its server parameters
    raw = RawClient(proc.host, proc.port)
    try:
        raw.startup(user="app", database="app")
        msg_type, body = raw.read_message()
        assert msg_type == "R"
        import hashlib

        salt = body[4:8]
        inner = hashlib.md5(b"app_passapp").hexdigest().encode()
        answer = hashlib.md5(inner + salt).hexdigest().encode()
        raw.send(build.password_message(b"md5" + answer + b"\x00"))
        raw.read_until("Z")
        raw.send(build.query("select 1"))
        assert [t for t, _ in raw.read_until("Z")] == ["T", "D", "C", "Z"]
        parse = build.message(b"P", b"split_stmt\x00select 41 + 1\x00\x00\x00")
        bind = build.message(b"B", b"\x00split_stmt\x00\x00\x00\x00\x00\x00\x00")
        execute = build.message(b"E", b"\x00\x00\x00\x00\x00")
        raw.send(parse[:3])
        time.sleep(0.2)
        raw.send(parse[3:] + bind + execute + build.SYNC)
        replies = raw.read_until("Z")
        assert [t for t, _ in replies] == ["1", "2", "D", "C", "Z"]
        assert replies[2][1].endswith(b"42")
        # the same name again on whichever server: still ours
        raw.send(bind + execute + build.SYNC)
        assert [t for t, _ in raw.read_until("Z")] == ["2", "D", "C", "Z"]
    finally:
        raw.close()


STATEMENT_MODE = {"pool_mode": "statement", "default_pool_size": 2, "max_client_conn": 200}


def test_statement_mode_psycopg_pipeline_prepare_8_clients_1_server(
    pgtarn_factory: PgtarnFactory,
) -> None:
    proc = pgtarn_factory(settings={**STATEMENT_MODE, "default_pool_size": 1})

    async def client(n: int) -> list[tuple[int, ...]]:
        async with await psycopg.AsyncConnection.connect(
            proc.dsn("app", "app_pass"), autocommit=True
        ) as conn:
            out = []
            for i in range(5):
                async with conn.pipeline():
                    cursors = [
                        await conn.execute("select %s::int + %s::int", (n, i), prepare=True),
                        await conn.execute("select %s::int * 2", (i,), prepare=True),
                        await conn.execute("select count(*) from items", prepare=True),
                    ]
                for cur in cursors:
                    row = await cur.fetchone()
                    assert row is not None
                    out.append(row)
            return out

    async def main() -> list[list[tuple[int, ...]]]:
        return await asyncio.gather(*(client(n) for n in range(8)))

    for n, rows in enumerate(asyncio.run(main())):
        assert rows == [row for i in range(5) for row in ((n + i,), (i * 2,), (3,))]


def test_statement_mode_psycopg_prepare_threshold_0_10_clients_2_servers(
    pgtarn_factory: PgtarnFactory,
) -> None:
    prepared_every_execute(pgtarn_factory(settings=STATEMENT_MODE), clients=10, executes=10)


def test_statement_mode_asyncpg_named_statements_10_clients_2_servers(
    pgtarn_factory: PgtarnFactory,
) -> None:
    proc = pgtarn_factory(settings=STATEMENT_MODE)

    async def client(n: int) -> list[int]:
        conn = await aconnect(proc, statement_cache_size=100)
        try:
            out = []
            stmt = await conn.prepare("select $1::int * 100 + $2::int", name=f"mine_{n % 3}")
            for i in range(10):
                out.append(await conn.fetchval("select $1::int * 10 + $2::int", n, i))
                out.append(await stmt.fetchval(n, i))
            return out
        finally:
            await conn.close()

    async def main() -> list[list[int]]:
        return await asyncio.gather(*(client(n) for n in range(10)))

    for n, values in enumerate(asyncio.run(main())):
        assert values == [v for i in range(10) for v in (n * 10 + i, n * 100 + i)]


def test_statement_mode_refuses_begin_with_prepared_statements_on(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    table = make_table(pg_cluster, "stmtprep_")
    proc = pgtarn_factory(settings={**STATEMENT_MODE, "default_pool_size": 1})
    for sql, prepare in (("begin", None), ("begin", True), ("select 1; begin", False)):
        # a BEGIN (as a Query, or a Parse), or a transaction opened some other way, ends
        # the client, as PgBouncer does
        with connect(proc, autocommit=True, prepare_threshold=0) as conn:
            # the client's statements go through the framer from here on
            assert conn.execute("select %s::int", (5,)).fetchone() == (5,)
            refused_begin(conn, sql, prepare=prepare)
    with connect(proc, autocommit=True, prepare_threshold=0) as conn:
        conn.execute(f"insert into {table} values (%s)", (1,))
        assert conn.execute("select %s::int + 1", (1,)).fetchone() == (2,)
    with connect(proc, prepare_threshold=0) as conn:  # psycopg's implicit BEGIN
        refused_begin(conn, f"insert into {table} values (%s)", params=(2,))
    assert pg_cluster.psql(f"select count(*) from {table}", dbname="app").strip() == "1"


def test_statement_mode_sql_prepare_execute_across_clients_1_server(
    pgtarn_factory: PgtarnFactory,
) -> None:
    proc = pgtarn_factory(settings={**STATEMENT_MODE, "default_pool_size": 1})
    with connect(proc, autocommit=True) as a, connect(proc, autocommit=True) as b:
        a.execute("prepare p1(int) as select $1 + 1", prepare=False)
        b.execute("prepare p1(int) as select $1 * 2", prepare=False)  # the same name: its own
        assert a.execute("execute p1(41)", prepare=False).fetchone() == (42,)
        assert b.execute("execute p1(21)", prepare=False).fetchone() == (42,)
        a.execute("deallocate p1", prepare=False)
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            a.execute("execute p1(1)", prepare=False)
        assert b.execute("execute p1(5)", prepare=False).fetchone() == (10,)


def test_another_clients_statement_is_never_reached_by_its_server_side_name(
    pgtarn_factory: PgtarnFactory,
) -> None:
    """pg_prepared_statements shows the server-side names of every client's statements; a
    client that names one it did not prepare gets PostgreSQL's 26000, as on a backend of its
    own, and the statement's own client is never touched."""
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    query = "select %s::int + 1"
    with (
        connect(proc, autocommit=True, prepare_threshold=0) as owner,
        connect(proc, autocommit=True) as other,
    ):
        assert owner.execute(query, (1,)).fetchone() == (2,)
        names = [
            row[0]
            for row in other.execute(
                "select name from pg_prepared_statements where name like 'pgtarn%'"
            ).fetchall()
        ]
        assert names
        for name in names:
            for sql in (f"EXECUTE {name}(1)", f"DEALLOCATE {name}", f"EXPLAIN EXECUTE {name}(1)"):
                with pytest.raises(
                    psycopg.errors.InvalidSqlStatementName,
                    match=f'prepared statement "{name}" does not exist',
                ):
                    other.execute(sql)
            raw = raw_login(proc)
            try:
                for batch in (
                    build.message(b"B", b"\x00" + name.encode() + b"\x00" + b"\x00" * 6)
                    + build.message(b"E", b"\x00\x00\x00\x00\x00"),
                    build.message(b"D", b"S" + name.encode() + b"\x00"),
                ):
                    raw.send(batch + build.message(b"S"))
                    replies = raw.read_until("E")
                    assert raw.read_until("Z")[-1] == ("Z", b"I")
                    errors = [error_fields(body) for kind, body in replies if kind == "E"]
                    assert [(e["C"], e["M"]) for e in errors] == [
                        ("26000", f'prepared statement "{name}" does not exist')
                    ]
            finally:
                raw.close()
        for i in range(3):  # the owner's statement is still there, unchanged
            assert owner.execute(query, (i,)).fetchone() == (i + 1,)
