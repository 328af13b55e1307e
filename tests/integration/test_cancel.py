"""CancelRequest routing: only the query of the client that asked is ever cancelled."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

import asyncpg
import psycopg
import pytest

from .drivers import aconnect, connect

pytestmark = pytest.mark.integration


def _run_in_thread(conn: psycopg.Connection[Any], sql: str) -> dict[str, Any]:
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["rows"] = conn.execute(sql).fetchall()
        except psycopg.Error as exc:
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    result["thread"] = thread
    return result


def _wait_running(watch: psycopg.Connection[Any], text: str) -> int:
    """The pid of the backend running a query containing text."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        row = watch.execute(
            "select pid from pg_stat_activity where state = 'active' and query like %s"
            " and pid <> pg_backend_pid()", (f"%{text}%",)).fetchone()
        if row:
            return int(row[0])
        time.sleep(0.02)
    raise AssertionError(f"query {text!r} never started")


def test_clients_sharing_one_server_cancel_only_their_own_query(pgtarn_factory, pg_dsn):  # type: ignore[no-untyped-def]
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    with connect(proc, autocommit=True) as a, connect(proc, autocommit=True) as b, \
            psycopg.connect(pg_dsn, autocommit=True) as watch:
        # each client has its own BackendKeyData, not the shared server's
        server_pid = a.execute("select pg_backend_pid()").fetchone()
        assert b.execute("select pg_backend_pid()").fetchone() == server_pid
        assert a.info.backend_pid != b.info.backend_pid
        assert server_pid is not None and server_pid[0] not in (a.info.backend_pid,
                                                                b.info.backend_pid)

        # a is idle (its server went back to the pool and now runs b's query):
        # a's cancel must not touch b's query
        running = _run_in_thread(b, "select 'b-one' from pg_sleep(1.5)")
        assert _wait_running(watch, "b-one") == server_pid[0]
        a.cancel()
        running["thread"].join()
        assert "error" not in running, running.get("error")
        assert running["rows"] == [("b-one",)]

        # b's own cancel stops b's query
        running = _run_in_thread(b, "select 'b-two' from pg_sleep(20)")
        _wait_running(watch, "b-two")
        b.cancel()
        running["thread"].join()
        assert isinstance(running.get("error"), psycopg.errors.QueryCanceled)

        # both go on working
        assert a.execute("select 1").fetchone() == (1,)
        assert b.execute("select 2").fetchone() == (2,)


def test_cancel_with_a_wrong_key_cancels_nothing(pgtarn_factory, pg_dsn):  # type: ignore[no-untyped-def]
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    from pgtarn.proto import build

    from .rawpg import RawClient

    with connect(proc, autocommit=True) as b, psycopg.connect(pg_dsn, autocommit=True) as watch:
        running = _run_in_thread(b, "select 'wrong-key' from pg_sleep(1)")
        _wait_running(watch, "wrong-key")
        raw = RawClient(proc.host, proc.port)
        raw.send(build.cancel_request(b.info.backend_pid, 12345))
        raw.close()
        running["thread"].join()
        assert running.get("rows") == [("wrong-key",)]


# --- a cancel in flight holds its server until PostgreSQL has dealt with it ----------------


async def _bystanders_cancelled(proc: Any, clients: int, rounds: int) -> tuple[int, int, int]:
    """clients run short queries while one more client cancels its own short queries
    (asyncpg's timeout= sends a CancelRequest when it passes); (57014 errors the others
    saw, queries they ran, timeouts the cancelling client had)."""
    stop = asyncio.Event()
    seen = [0, 0]

    async def bystander() -> None:
        conn = await aconnect(proc)
        try:
            while not stop.is_set():
                try:
                    await conn.fetchval("select pg_sleep(0.002)")
                except asyncpg.QueryCanceledError:
                    seen[0] += 1
                seen[1] += 1
        finally:
            await conn.close()

    async def canceller() -> int:
        conn = await aconnect(proc)
        timeouts = 0
        took = 0.01  # how long its last query took, waits for a server included
        try:
            for index in range(rounds):
                # a timeout about when the query ends: its cancel races the query's end
                timeout = took * (0.7 + 0.05 * (index % 8))
                started = time.monotonic()
                with contextlib.suppress(asyncpg.QueryCanceledError):
                    try:
                        await conn.fetchval("select pg_sleep(0.004)", timeout=timeout)
                        took = time.monotonic() - started
                    except TimeoutError:
                        timeouts += 1
                        took *= 1.1
                        # asyncpg waits for its cancel here (a query with a timeout shorter
                        # than that wait would close the connection instead)
                        await conn.fetchval("select 1")
        finally:
            stop.set()
            await conn.close()
        return timeouts

    tasks = [asyncio.create_task(bystander()) for _ in range(clients)]
    timeouts = await canceller()
    await asyncio.gather(*tasks)
    return seen[0], seen[1], timeouts


@pytest.mark.parametrize("pool_size", [1, 2])
def test_a_cancel_in_flight_never_reaches_another_clients_query(  # type: ignore[no-untyped-def]
        pgtarn_factory, pool_size):
    proc = pgtarn_factory(settings={"default_pool_size": pool_size})
    cancelled, ran, timeouts = asyncio.run(_bystanders_cancelled(proc, 20, 150))
    assert timeouts > 0 and ran > 0  # the race was run
    assert cancelled == 0, f"{cancelled} of {ran} queries of other clients were cancelled"
