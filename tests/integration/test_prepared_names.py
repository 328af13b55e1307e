"""A client's statement names through transaction pooling, as on a direct connection: a name
already in use, DEALLOCATE ALL / DISCARD ALL, and max_prepared_statements changed at run time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import asyncpg
import psycopg
import pytest
from psycopg import pq
from psycopg.pq.abc import PGresult

from tests.support import PgtarnProcess

from .conftest import PgtarnFactory
from .drivers import aconnect, connect
from .pgstat import wait_until

pytestmark = pytest.mark.integration

Outcome = tuple[str, str]


def _outcome(result: PGresult) -> Outcome:
    """A libpq result as (status, SQLSTATE or first value)."""
    if result.status == pq.ExecStatus.FATAL_ERROR:
        return "error", (result.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode()
    if result.status == pq.ExecStatus.TUPLES_OK:
        return "rows", (result.get_value(0, 0) or b"").decode()
    return pq.ExecStatus(result.status).name, ""


def _both(pg_dsn: str, proc: PgtarnProcess, scenario: Callable[[psycopg.Connection[Any]], list[Any]]
          ) -> list[Any]:  # fmt: skip
    """What scenario gives through pgtarn, checked to be what it gives on a direct connection."""
    with psycopg.connect(pg_dsn, autocommit=True) as direct:
        expected = scenario(direct)
    with connect(proc, autocommit=True) as pooled:
        assert scenario(pooled) == expected
    return expected


def test_parse_of_a_name_in_use_is_refused_as_postgresql_refuses_it(
    pgtarn_factory: PgtarnFactory, pg_dsn: str
) -> None:
    """A Parse naming a statement the client already has gets 42P05 and the name keeps its
    statement; the unnamed statement is replaced; a name closed or deallocated is free."""
    proc = pgtarn_factory(settings={"default_pool_size": 1})

    def scenario(conn: psycopg.Connection[Any]) -> list[Outcome]:
        pgconn = conn.pgconn
        out = [
            _outcome(pgconn.prepare(b"test", b"SELECT 1")),
            _outcome(pgconn.prepare(b"test", b"SELECT 1")),
            _outcome(pgconn.prepare(b"test", b"SELECT 2")),
            _outcome(pgconn.exec_prepared(b"test", None)),
            _outcome(pgconn.prepare(b"", b"SELECT 3")),
            _outcome(pgconn.prepare(b"", b"SELECT 4")),
            _outcome(pgconn.exec_prepared(b"", None)),
            # a syntax error is found before the name is looked at
            _outcome(pgconn.prepare(b"test", b"SELEC 5")),
        ]
        conn.execute("DEALLOCATE test", prepare=False)
        out += [
            _outcome(pgconn.prepare(b"test", b"SELECT 6")),
            _outcome(pgconn.exec_prepared(b"test", None)),
        ]
        # in a transaction block the error aborts it, as any error does
        out.append(_outcome(pgconn.exec_(b"BEGIN")))
        out.append(_outcome(pgconn.prepare(b"test", b"SELECT 7")))
        out.append(_outcome(pgconn.exec_(b"SELECT 8")))
        out.append(_outcome(pgconn.exec_(b"ROLLBACK")))
        out.append(_outcome(pgconn.exec_prepared(b"test", None)))
        conn.execute("DEALLOCATE test", prepare=False)
        return out

    assert _both(pg_dsn, proc, scenario) == [
        ("COMMAND_OK", ""),
        ("error", "42P05"),
        ("error", "42P05"),
        ("rows", "1"),
        ("COMMAND_OK", ""),
        ("COMMAND_OK", ""),
        ("rows", "4"),
        ("error", "42601"),
        ("COMMAND_OK", ""),
        ("rows", "6"),
        ("COMMAND_OK", ""),
        ("error", "42P05"),
        ("error", "25P02"),
        ("COMMAND_OK", ""),
        ("rows", "6"),
    ]
    with connect(proc, autocommit=True) as conn:
        conn.pgconn.prepare(b"mine", b"SELECT 1")
        result = conn.pgconn.prepare(b"mine", b"SELECT 1")
        assert (
            (result.error_message or b"")
            .decode()
            .endswith('prepared statement "mine" already exists\n')
        )
    wait_until(lambda: "prepared statement 'mine' was already prepared" in proc.log_text())


def test_asyncpg_named_statement_twice(pgtarn_factory: PgtarnFactory) -> None:
    """asyncpg's prepare(name=...) of a name in use raises its DuplicatePreparedStatementError;
    another client may use the same name and text. (asyncpg's prepare ends with a Flush,
    not a Sync: the client keeps its server until its next query, hence two servers.)"""
    proc = pgtarn_factory(settings={"default_pool_size": 2})

    async def main() -> list[int]:
        a, b = await aconnect(proc), await aconnect(proc)
        try:
            first = await a.prepare("select $1::int * 2", name="twice")
            with pytest.raises(asyncpg.DuplicatePreparedStatementError):
                await a.prepare("select $1::int * 3", name="twice")
            other = await b.prepare("select $1::int * 2", name="twice")
            return [await first.fetchval(4), await other.fetchval(5), await first.fetchval(6)]
        finally:
            await a.close()
            await b.close()

    assert asyncio.run(main()) == [8, 10, 12]


def _pipeline(conn: psycopg.Connection[Any], batches: list[list[tuple[bytes, bytes]]]
              ) -> list[Outcome]:  # fmt: skip
    """Each batch's Parses (name, query) then a Sync, all sent before any reply is read."""
    pgconn = conn.pgconn
    pgconn.enter_pipeline_mode()
    for batch in batches:
        for name, query in batch:
            pgconn.send_prepare(name, query)
        pgconn.pipeline_sync()
    out: list[Outcome] = []
    for batch in batches:
        for _ in batch:
            result = pgconn.get_result()
            assert result is not None
            out.append(_outcome(result))
            assert pgconn.get_result() is None
        result = pgconn.get_result()
        assert result is not None and result.status == pq.ExecStatus.PIPELINE_SYNC
    pgconn.exit_pipeline_mode()
    return out


def test_name_reuse_in_a_pipeline(pgtarn_factory: PgtarnFactory, pg_dsn: str) -> None:
    """In one batch a name defined twice is refused the second time (had the first failed,
    the second would be skipped); a name whose Parse failed in an earlier batch is free."""
    proc = pgtarn_factory(settings={"default_pool_size": 1})

    def scenario(conn: psycopg.Connection[Any]) -> list[Outcome]:
        out = _pipeline(
            conn,
            [
                [(b"p", b"SELECT 1"), (b"p", b"SELECT 2")],
                [(b"q", b"SELEC 1")],
                [(b"q", b"SELECT 3")],
                [(b"r", b"SELEC 1"), (b"r", b"SELECT 4")],
            ],
        )
        out += [_outcome(conn.pgconn.exec_prepared(name, None)) for name in (b"p", b"q")]
        out.append(_outcome(conn.pgconn.prepare(b"r", b"SELECT 5")))
        conn.execute("DEALLOCATE ALL", prepare=False)
        return out

    assert _both(pg_dsn, proc, scenario) == [
        ("COMMAND_OK", ""),
        ("error", "42P05"),
        ("error", "42601"),
        ("COMMAND_OK", ""),
        ("error", "42601"),
        ("PIPELINE_ABORTED", ""),
        ("rows", "1"),
        ("rows", "3"),
        ("COMMAND_OK", ""),
    ]


def _forgets_all(
    first: psycopg.Connection[Any], second: psycopg.Connection[Any], command: str
) -> list[Any]:
    """PgBouncer's DEALLOCATE ALL / DISCARD ALL scenario, with libpq's own calls too: what
    each step gives."""
    out: list[Any] = []
    for conn in (first, first, second):
        out.append(conn.execute("SELECT 1", prepare=True).fetchone())
    out.append(_outcome(first.pgconn.prepare(b"mine", b"SELECT 3")))
    out.append(_outcome(second.pgconn.prepare(b"theirs", b"SELECT 4")))
    first.execute(command)
    out.append(second.execute("SELECT 1", prepare=True).fetchone())
    out.append(_outcome(second.pgconn.exec_prepared(b"theirs", None)))
    # the name is gone: PostgreSQL's 26000, and the connection goes on
    out.append(_outcome(first.pgconn.exec_prepared(b"mine", None)))
    out.append(_outcome(first.pgconn.describe_prepared(b"mine")))
    out.append(_outcome(first.pgconn.prepare(b"mine", b"SELECT 5")))
    out.append(_outcome(first.pgconn.exec_prepared(b"mine", None)))
    # psycopg prepares its statement again or binds the name it had (by its version): the
    # same as on a direct connection either way
    try:
        out.append(first.execute("SELECT 1", prepare=True).fetchone())
    except psycopg.Error as error:
        out.append(error.diag.sqlstate)
    out.append(first.execute("SELECT 2", prepare=True).fetchone())
    second.execute("DEALLOCATE theirs")
    return out


@pytest.mark.parametrize("command", ["DEALLOCATE ALL", "DISCARD ALL"])
def test_forgetting_every_statement_forgets_the_clients_names_only(
    pgtarn_factory: PgtarnFactory, pg_dsn: str, command: str
) -> None:
    """A client's DEALLOCATE ALL / DISCARD ALL forgets its names, as on a direct connection
    (26000 for a name it still uses, the connection kept; PgBouncer closes it), and not
    another client's statements on the same server."""
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    with (
        psycopg.connect(pg_dsn, autocommit=True) as a,
        psycopg.connect(pg_dsn, autocommit=True) as b,
    ):
        expected = _forgets_all(a, b, command)
    assert expected[5:11] == [
        (1,),
        ("rows", "4"),
        ("error", "26000"),
        ("error", "26000"),
        ("COMMAND_OK", ""),
        ("rows", "5"),
    ]
    with connect(proc, autocommit=True) as a, connect(proc, autocommit=True) as b:
        assert _forgets_all(a, b, command) == expected
        assert not a.closed and a.execute("SELECT 6").fetchone() == (6,)


def test_max_prepared_statements_set_to_0_at_run_time(pgtarn_factory: PgtarnFactory) -> None:
    """Clients logged in before keep their statements (PgBouncer would send their names to
    servers that never had them): on a server made since, at most 200 (PgBouncer's default),
    the oldest closed first. Clients logged in after it get no statement handling."""
    proc = pgtarn_factory(settings={"default_pool_size": 1, "max_prepared_statements": 5})
    with (
        connect(proc, autocommit=True) as before,
        psycopg.connect(
            proc.dsn("app", "app_pass", dbname="pgbouncer"), autocommit=True
        ) as console,
    ):
        for n in range(3):
            assert before.execute(f"select {n}", prepare=True).fetchone() == (n,)
        console.execute("SET max_prepared_statements = 0")
        console.execute("RECONNECT app")  # the next server is made under the new value
        wait_until(lambda: before.execute("select 0", prepare=True).fetchone() == (0,))
        for n in range(205):
            assert before.execute(f"select {n}", prepare=True).fetchone() == (n,)
        names = before.execute("select name from pg_prepared_statements").fetchall()
        assert len(names) == 200 and all(n.startswith("pgtarn_") for (n,) in names)
        with connect(proc, autocommit=True) as after:
            assert after.execute("select 7", prepare=True).fetchone() == (7,)
            names = after.execute("select name from pg_prepared_statements").fetchall()
            assert ("_pg3_0",) in names  # its own name, on the server it shares
            after.execute("deallocate all")


def test_a_statement_a_server_lost_unseen_is_prepared_again(pgtarn_factory: PgtarnFactory) -> None:
    """With max_prepared_statements set to 0 at run time, a client logged in after it runs
    DEALLOCATE ALL as it is on the server it shares with a client from before: that
    client's statement fails once with PostgreSQL's 26000, then is prepared again."""
    proc = pgtarn_factory(settings={"default_pool_size": 1})

    async def main() -> list[Any]:
        before = await aconnect(proc)
        try:
            stmt = await before.prepare("select $1::int + 1", name="mine")
            out: list[Any] = [await stmt.fetchval(1)]
            with psycopg.connect(
                proc.dsn("app", "app_pass", dbname="pgbouncer"), autocommit=True
            ) as console:
                console.execute("SET max_prepared_statements = 0")
            with connect(proc, autocommit=True) as after:
                after.execute("DEALLOCATE ALL")
            for n in range(3):
                try:
                    out.append(await stmt.fetchval(n))
                except asyncpg.PostgresError as error:
                    out.append(error.sqlstate)
            return out
        finally:
            await before.close()

    assert asyncio.run(main()) == [2, "26000", 2, 3]


def test_a_refused_parse_leaves_the_names_session_effects(
    pgtarn_factory: PgtarnFactory, pg_dsn: str
) -> None:
    """Session state follows the statement a name keeps: a refused Parse of `SET` under a
    name in use changes nothing, and the name's own `SET` still counts."""
    proc = pgtarn_factory(settings={"default_pool_size": 1})

    def scenario(a: psycopg.Connection[Any], b: psycopg.Connection[Any]) -> list[Any]:
        out: list[Any] = [
            _outcome(a.pgconn.prepare(b"s", b"SELECT 1")),
            _outcome(a.pgconn.prepare(b"s", b"SET work_mem = '1MB'")),
            _outcome(a.pgconn.exec_prepared(b"s", None)),
            _outcome(a.pgconn.prepare(b"t", b"SET work_mem = '2MB'")),
            _outcome(a.pgconn.prepare(b"t", b"SELECT 2")),
            _outcome(a.pgconn.exec_prepared(b"t", None)),
        ]
        for conn in (b, a, b, a):  # one server: pgtarn sets each client's state on it
            out.append(conn.execute("show work_mem").fetchone())
        a.execute("deallocate all")
        return out

    with (
        psycopg.connect(pg_dsn, autocommit=True) as a,
        psycopg.connect(pg_dsn, autocommit=True) as b,
    ):
        expected = scenario(a, b)
    assert expected[-4:] == [("4MB",), ("2MB",), ("4MB",), ("2MB",)]
    with connect(proc, autocommit=True) as a, connect(proc, autocommit=True) as b:
        assert scenario(a, b) == expected
