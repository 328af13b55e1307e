"""Pins that end exactly when the session state ends: an advisory lock counts only when
PostgreSQL granted it (pg_try_advisory_lock true) or released it (pg_advisory_unlock true), by
the simple and the extended protocol, text or binary results; nothing counts from a statement
that never ran; temporary tables end their pin when dropped; what cannot be read stays pinned."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from tests.support import PgtarnProcess, TempCluster

from .conftest import PgtarnFactory
from .drivers import aconnect, connect
from .test_admin import admin, show
from .test_session_state import RELEASE_WAIT, advisory_locks

Conn = psycopg.Connection[Any]


def pins(proc: PgtarnProcess, name: str) -> str:
    """SHOW CLIENTS' pinned column of the client whose application_name is name."""
    with admin(proc) as console:
        rows = [r for r in show(console, "CLIENTS") if r["application_name"] == name]
    assert len(rows) == 1, rows
    return str(rows[0]["pinned"])


def client(proc: PgtarnProcess, name: str, **kw: Any) -> Conn:
    return connect(proc, autocommit=True, application_name=name, **kw)


def pool_of_two(pgtarn_factory: PgtarnFactory) -> Any:
    """transaction mode, 2 servers; a client that waits for a server longer than RELEASE_WAIT
    gets an error (a server held by a pin) instead of hanging the test."""
    return pgtarn_factory(
        settings={
            "default_pool_size": 2,
            "pool_mode": "transaction",
            "query_wait_timeout": RELEASE_WAIT,
        }
    )


def assert_both_servers_free(proc: PgtarnProcess) -> None:
    """Two new clients each hold a server at once (pool of 2): no server is held by a pin."""
    with client(proc, "pins_probe1") as first, client(proc, "pins_probe2") as second:
        first.execute("begin")
        second.execute("begin")
        pids = {
            first.execute("select pg_backend_pid()").fetchone(),
            second.execute("select pg_backend_pid()").fetchone(),
        }
        assert len(pids) == 2, pids
        first.execute("commit")
        second.execute("commit")


def one(conn: Conn, sql: str, params: Any = None) -> Any:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


# -- a try-lock that PostgreSQL refuses takes nothing -------------------------------------


@pytest.mark.parametrize("prepare", [None, 0], ids=["simple", "prepared"])
def test_refused_try_lock_does_not_pin_and_a_granted_one_does(
    pgtarn_factory: PgtarnFactory, prepare: bool
) -> None:
    """A holds lock 61; B's pg_try_advisory_lock(61) is false and leaves B unpinned (a third
    client is served at once); once A unlocks, B's try-lock is true (pinned) and its
    pg_advisory_unlock ends the pin, so both servers are free again."""
    proc = pool_of_two(pgtarn_factory)
    kw = {} if prepare is None else {"prepare_threshold": prepare}
    with client(proc, "pins_a") as a, client(proc, "pins_b", **kw) as b:
        a.execute("select pg_advisory_lock(61)")
        params = None if prepare is None else ()
        assert one(b, "select pg_try_advisory_lock(61)", params) is False
        assert pins(proc, "pins_b") == ""
        with client(proc, "pins_c") as c:  # A holds one server, B none: C gets the other
            assert one(c, "select 1") == 1
        a.execute("select pg_advisory_unlock(61)")
        assert pins(proc, "pins_a") == ""
        assert one(b, "select pg_try_advisory_lock(61)", params) is True
        assert pins(proc, "pins_b") == "advisory_lock"
        assert one(b, "select pg_advisory_unlock(61)", params) is True
        assert pins(proc, "pins_b") == ""
        assert_both_servers_free(proc)


def test_try_lock_forms_and_binary_results_psycopg(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    """The shared and two-int forms, with parameters, results in binary (psycopg's binary
    cursor, prepared): false pins nothing, true pins until the matching unlock is true."""
    proc = pool_of_two(pgtarn_factory)
    with client(proc, "pins_a") as a, client(proc, "pins_b", prepare_threshold=0) as b:
        a.execute("select pg_advisory_lock(62), pg_advisory_lock(6, 2)")
        cur = b.cursor(binary=True)
        for sql, args in (
            ("select pg_try_advisory_lock(%s)", (62,)),
            ("select pg_try_advisory_lock_shared(%s)", (62,)),
            ("select pg_try_advisory_lock(%s, %s)", (6, 2)),
            ("select pg_try_advisory_lock_shared(%s, %s)", (6, 2)),
        ):
            row = cur.execute(sql, args).fetchone()
            assert row == (False,), sql
            assert pins(proc, "pins_b") == "", sql
        a.execute("select pg_advisory_unlock(62), pg_advisory_unlock(6, 2)")
        assert cur.execute("select pg_try_advisory_lock_shared(%s, %s)", (6, 2)).fetchone() == (
            True,
        )
        assert pins(proc, "pins_b") == "advisory_lock"
        assert cur.execute("select pg_advisory_unlock_shared(%s, %s)", (6, 2)).fetchone() == (True,)
        assert pins(proc, "pins_b") == ""
        assert_both_servers_free(proc)
    assert advisory_locks(pg_cluster, 62) == 0


@pytest.mark.parametrize("cache", [0, 100], ids=["unnamed", "named"])
def test_try_lock_through_asyncpg(pgtarn_factory: PgtarnFactory, cache: bool) -> None:
    """asyncpg (extended protocol, binary results; unnamed statements or its statement
    cache): a false try-lock pins nothing, a true one pins until unlocked."""
    proc = pool_of_two(pgtarn_factory)

    async def scenario() -> list[str]:
        a = await aconnect(proc, server_settings={"application_name": "pins_a"})
        b = await aconnect(
            proc, statement_cache_size=cache, server_settings={"application_name": "pins_b"}
        )
        seen = []
        try:
            await a.execute("select pg_advisory_lock(63)")
            assert await b.fetchval("select pg_try_advisory_lock($1)", 63) is False
            seen.append(pins(proc, "pins_b"))
            await a.execute("select pg_advisory_unlock(63)")
            assert await b.fetchval("select pg_try_advisory_lock($1)", 63) is True
            seen.append(pins(proc, "pins_b"))
            assert await b.fetchval("select pg_advisory_unlock($1)", 63) is True
            seen.append(pins(proc, "pins_b"))
        finally:
            await a.close()
            await b.close()
        return seen

    assert asyncio.run(scenario()) == ["", "advisory_lock", ""]
    assert_both_servers_free(proc)


# -- an unlock that releases nothing ---------------------------------------------------------


def test_unlock_that_releases_nothing_keeps_the_count(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    """pg_advisory_unlock returning false changes nothing: with nothing held no pin comes of
    it; a lock taken by parameter stays pinned through an unlock of another value; a lock
    held once and unlocked twice leaves the count at zero, not below (the next lock pins)."""
    proc = pool_of_two(pgtarn_factory)
    with client(proc, "pins_b") as b:
        assert one(b, "select pg_advisory_unlock(64)") is False
        assert pins(proc, "pins_b") == ""
        b.execute("select pg_advisory_lock(%s)", (64,))  # its key as written: $1
        assert pins(proc, "pins_b") == "advisory_lock"
        assert one(b, "select pg_advisory_unlock(%s)", (65,)) is False
        assert pins(proc, "pins_b") == "advisory_lock"
        assert advisory_locks(pg_cluster, 64) == 1
        assert one(b, "select pg_advisory_unlock(%s)", (64,)) is True
        assert pins(proc, "pins_b") == ""
        b.execute("select pg_advisory_lock(66)")
        assert one(b, "select pg_advisory_unlock(66)") is True
        assert one(b, "select pg_advisory_unlock(66)") is False
        assert pins(proc, "pins_b") == ""
        b.execute("select pg_advisory_lock(66)")
        assert pins(proc, "pins_b") == "advisory_lock"
        assert one(b, "select pg_advisory_unlock(66)") is True
        assert pins(proc, "pins_b") == ""
        assert_both_servers_free(proc)


# -- failed statements -------------------------------------------------------------------------


def test_lock_in_a_statement_that_never_ran_does_not_pin(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    """A lock call after a failing statement of the same Query never runs: no pin. A lock
    that fails itself (lock_timeout while another client holds it) takes nothing either."""
    proc = pool_of_two(pgtarn_factory)
    with client(proc, "pins_a") as a, client(proc, "pins_b") as b:
        with pytest.raises(psycopg.errors.DivisionByZero):
            b.execute("select 1/0; select pg_advisory_lock(67)")
        assert pins(proc, "pins_b") == ""
        assert advisory_locks(pg_cluster, 67) == 0
        a.execute("select pg_advisory_lock(68)")
        b.execute("set lock_timeout = '50ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            b.execute("select pg_advisory_lock(68)")
        assert pins(proc, "pins_b") == ""
        a.execute("select pg_advisory_unlock(68)")
        assert_both_servers_free(proc)


def test_lock_before_an_error_in_its_statement_stays_pinned(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    """A statement that took a session lock and then failed leaves the lock held (session
    locks ignore the rollback): the client stays pinned, so no other client gets a server
    holding it."""
    proc = pool_of_two(pgtarn_factory)
    with client(proc, "pins_b") as b:
        with pytest.raises(psycopg.errors.DivisionByZero):
            b.execute("select pg_advisory_lock(69), 1 / (random() * 0)::int")
        assert advisory_locks(pg_cluster, 69) == 1
        assert pins(proc, "pins_b") == "advisory_lock"
        b.execute("select pg_advisory_unlock_all()")
        assert pins(proc, "pins_b") == ""
    assert advisory_locks(pg_cluster, 69) == 0


def test_unlock_all_that_never_ran_keeps_the_pin(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster
) -> None:
    """pg_advisory_unlock_all() in a statement that returned no row did not run: the lock is
    still held and the client still pinned."""
    proc = pool_of_two(pgtarn_factory)
    with client(proc, "pins_b") as b:
        b.execute("select pg_advisory_lock(70)")
        b.execute("select pg_advisory_unlock_all() where false")
        assert advisory_locks(pg_cluster, 70) == 1
        assert pins(proc, "pins_b") == "advisory_lock"
        b.execute("select pg_advisory_unlock_all()")
        assert pins(proc, "pins_b") == ""


# -- temporary tables ------------------------------------------------------------------------


def test_dropping_the_temp_tables_ends_the_pin(pgtarn_factory: PgtarnFactory) -> None:
    """A temp table pins until it is dropped (DROP TABLE of its name); one of two dropped
    keeps the pin; a DROP that fails, or one rolled back, keeps it too."""
    proc = pool_of_two(pgtarn_factory)
    with client(proc, "pins_b") as b:
        b.execute("create temp table pins_t1 (v int)")
        b.execute("create temp table pins_t2 (v int)")
        assert pins(proc, "pins_b") == "temp_object"
        b.execute("drop table pins_t1")
        assert pins(proc, "pins_b") == "temp_object"
        b.execute("begin")
        b.execute("drop table pins_t2")
        b.execute("rollback")
        assert pins(proc, "pins_b") == "temp_object"
        with pytest.raises(psycopg.errors.UndefinedTable):
            b.execute("drop table pins_t2, pins_nothing")
        assert pins(proc, "pins_b") == "temp_object"
        b.execute("drop table pins_t2")
        assert pins(proc, "pins_b") == ""
        assert_both_servers_free(proc)


@pytest.mark.parametrize("cache", [0, 100])
def test_asyncpg_type_introspection_does_not_pin(
    pgtarn_factory: PgtarnFactory, pg_cluster: TempCluster, cache: bool
) -> None:
    """asyncpg looks a custom type up with jit off, then sets jit back with
    set_config('jit', $1, false): the value comes with the Bind, so it is a setting the
    client keeps (replayed on its next servers), not a pin for good."""
    pg_cluster.psql(
        "DROP TYPE IF EXISTS mood_pin; CREATE TYPE mood_pin AS ENUM ('ok', 'meh');"
        " ALTER DATABASE app SET jit = on;",
        dbname="app",
    )
    proc = pgtarn_factory(settings={"default_pool_size": 1, "query_wait_timeout": 10})

    async def main() -> tuple[str, str, str]:
        first = await aconnect(
            proc, statement_cache_size=cache, server_settings={"application_name": "first"}
        )
        second = await aconnect(proc, statement_cache_size=cache)
        try:
            assert await first.fetchval("SELECT 'meh'::mood_pin") == "meh"
            reasons = pins(proc, "first")
            # the only server is free for the other client at once
            assert await asyncio.wait_for(second.fetchval("SELECT 1"), 5) == 1
            return reasons, await first.fetchval("SHOW jit"), await second.fetchval("SHOW jit")
        finally:
            await first.close()
            await second.close()

    try:
        reasons, jit_first, jit_second = asyncio.run(main())
    finally:
        pg_cluster.psql("ALTER DATABASE app RESET jit", dbname="app")
    assert reasons == ""
    assert jit_first == "on" and jit_second == "on"
