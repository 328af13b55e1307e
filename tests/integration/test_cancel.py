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

from pgtarn.proto import build
from pgtarn.proto.server_login import ServerAuth
from tests.support import PgtarnProcess

from .conftest import PgtarnFactory
from .drivers import aconnect, connect
from .faultproxy import FaultProxy
from .pgstat import wait_until
from .rawpg import AsyncRawClient, RawClient
from .test_admin import admin, pool_row

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
            " and pid <> pg_backend_pid()",
            (f"%{text}%",),
        ).fetchone()
        if row:
            return int(row[0])
        time.sleep(0.02)
    raise AssertionError(f"query {text!r} never started")


def test_clients_sharing_one_server_cancel_only_their_own_query(
    pgtarn_factory: PgtarnFactory, pg_dsn: str
) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    with (
        connect(proc, autocommit=True) as a,
        connect(proc, autocommit=True) as b,
        psycopg.connect(pg_dsn, autocommit=True) as watch,
    ):
        # each client has its own BackendKeyData, not the shared server's
        server_pid = a.execute("select pg_backend_pid()").fetchone()
        assert b.execute("select pg_backend_pid()").fetchone() == server_pid
        assert a.info.backend_pid != b.info.backend_pid
        assert server_pid is not None and server_pid[0] not in (
            a.info.backend_pid,
            b.info.backend_pid,
        )

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


def test_cancel_with_a_wrong_key_cancels_nothing(
    pgtarn_factory: PgtarnFactory, pg_dsn: str
) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    with connect(proc, autocommit=True) as b, psycopg.connect(pg_dsn, autocommit=True) as watch:
        running = _run_in_thread(b, "select 'wrong-key' from pg_sleep(1)")
        _wait_running(watch, "wrong-key")
        raw = RawClient(proc.host, proc.port)
        raw.send(build.cancel_request(b.info.backend_pid, 12345))
        raw.close()
        running["thread"].join()
        assert running.get("rows") == [("wrong-key",)]


# --- a cancel in flight holds its server until PostgreSQL has dealt with it ----------------


async def _bystanders_cancelled(
    proc: PgtarnProcess, clients: int, rounds: int
) -> tuple[int, int, int]:
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
def test_a_cancel_in_flight_never_reaches_another_clients_query(
    pgtarn_factory: PgtarnFactory, pool_size: int
) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": pool_size})
    cancelled, ran, timeouts = asyncio.run(_bystanders_cancelled(proc, 20, 150))
    assert timeouts > 0 and ran > 0  # the race was run
    assert cancelled == 0, f"{cancelled} of {ran} queries of other clients were cancelled"


async def _next_query_cancelled_after_failed_copy(
    proc: PgtarnProcess, rounds: int, size: int
) -> int:
    """asyncpg: a copy_records_to_table that fails on bad data (asyncpg sends CopyFail and
    a CancelRequest), then SELECT pg_sleep(0.05) on the same connection; how many of those
    were cancelled."""
    pool = await asyncpg.create_pool(
        host=proc.host,
        port=proc.port,
        user="app",
        password="app_pass",
        database="app",
        ssl=False,
        statement_cache_size=0,
        min_size=size,
        max_size=size,
    )
    cancelled = 0

    async def one_round() -> None:
        nonlocal cancelled
        async with pool.acquire() as conn:
            with pytest.raises((asyncpg.DataError, TypeError)):
                await conn.copy_records_to_table("cancel_copy", records=[("not a number",)])
            try:
                await conn.fetchval("select pg_sleep(0.05)")
            except asyncpg.QueryCanceledError:
                cancelled += 1

    try:
        await asyncio.gather(*(one_round() for _ in range(rounds)))
    finally:
        await pool.close()
    return cancelled


def test_the_query_after_a_failed_copy_is_never_cancelled(
    pgtarn_factory: PgtarnFactory, pg_dsn: str
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as direct:
        direct.execute("create table if not exists cancel_copy (n int)")
    proc = pgtarn_factory(settings={"default_pool_size": 10})
    cancelled = asyncio.run(_next_query_cancelled_after_failed_copy(proc, 100, 10))
    assert cancelled == 0, f"{cancelled} of 100 queries after a failed copy were cancelled"


async def _next_query_cancelled_after_timeout(proc: PgtarnProcess, rounds: int) -> tuple[int, int]:
    """asyncpg: a query with timeout= that ends about when the timeout passes, then one more
    query; (how many of those were cancelled, how many timeouts passed)."""
    conn = await aconnect(proc)
    cancelled = timeouts = 0
    try:
        for index in range(rounds):
            try:
                await conn.fetchval("select pg_sleep(0.01)", timeout=0.008 + 0.001 * (index % 5))
            except TimeoutError:
                timeouts += 1
            except asyncpg.QueryCanceledError:
                pass
            try:
                await conn.fetchval("select pg_sleep(0.02)")
            except asyncpg.QueryCanceledError:
                cancelled += 1
    finally:
        await conn.close()
    return cancelled, timeouts


def test_the_query_after_a_timed_out_one_is_never_cancelled(pgtarn_factory: PgtarnFactory) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 2})
    cancelled, timeouts = asyncio.run(_next_query_cancelled_after_timeout(proc, 60))
    assert timeouts > 0
    assert cancelled == 0, f"{cancelled} of 60 queries after a timed-out one were cancelled"


async def _cancel_of_an_idle_client(proc: PgtarnProcess) -> bytes:
    """A client runs a query, then its CancelRequest comes (it holds no server); what the
    cancel connection gets before pgtarn closes it, and the client's next query's result."""
    client = await AsyncRawClient.connect(proc.host, proc.port, "app", "app_pass", "app")
    try:
        assert await client.query("select 1") == [["1"]]
        reader, writer = await asyncio.open_connection(proc.host, proc.port)
        writer.write(build.cancel_request(*client.backend_key))
        answer = await asyncio.wait_for(reader.read(), 10)  # (EOF: closed by pgtarn)
        writer.close()
        assert await client.query("select 2") == [["2"]]
        return answer
    finally:
        await client.close()


def test_a_cancel_for_a_client_with_no_server_is_dropped_and_closed(
    pgtarn_factory: PgtarnFactory,
) -> None:
    proc = pgtarn_factory(settings={"default_pool_size": 1})
    assert asyncio.run(_cancel_of_an_idle_client(proc)) == b""


def _raw_login(proc: PgtarnProcess) -> tuple[RawClient, tuple[int, int]]:
    """A logged-in raw client (up to its first ReadyForQuery), and its cancel key."""
    raw = RawClient(proc.host, proc.port)
    login = ServerAuth("app", "app_pass")
    raw.send(build.startup_message({"user": "app", "database": "app"}))
    while not login.done:
        msg_type, body = raw.read_message()
        reply = login.feed(ord(msg_type), body)
        if reply:
            raw.send(reply)
    return raw, login.backend_key


def test_a_server_with_a_cancel_in_flight_is_held_until_the_cancel_ends(
    pgtarn_factory: PgtarnFactory, fault_proxy: FaultProxy, pg_dsn: str
) -> None:
    """The cancel's connection to PostgreSQL hangs (the proxy takes no new connections): the
    query it was for ends by itself, and its server is held, shown in SHOW POOLS, while the
    next client waits; the client's cancel connection stays open; cancel_wait_timeout ends
    the cancel, and the server serves the next client."""
    proc = pgtarn_factory(
        databases={"app": f"host={fault_proxy.host} port={fault_proxy.port} dbname=app"},
        settings={"default_pool_size": 1, "cancel_wait_timeout": 3},
    )
    owner, key = _raw_login(proc)
    with (
        connect(proc, autocommit=True) as other,
        admin(proc) as console,
        psycopg.connect(pg_dsn, autocommit=True) as watch,
    ):
        owner.send(build.query("select 'held' from pg_sleep(1)"))
        _wait_running(watch, "held")
        fault_proxy.stall_connects()  # the server carries on; the cancel cannot connect
        cancel = RawClient(proc.host, proc.port)
        try:
            cancel.send(build.cancel_request(*key))
            wait_until(lambda: pool_row(console)["sv_active_cancel"] == 1, what="the cancel")
            assert pool_row(console)["cl_active_cancel_req"] == 1
            replies = owner.read_until("Z")
            assert [kind for kind, _ in replies] == ["T", "D", "C", "Z"]  # never cancelled
            wait_until(lambda: pool_row(console)["sv_being_canceled"] == 1, what="the server held")
            assert pool_row(console)["sv_idle"] == 0
            waiting = _run_in_thread(other, "select 'next'")
            wait_until(lambda: pool_row(console)["cl_waiting"] == 1, what="the next client")
            cancel.sock.setblocking(False)
            with pytest.raises(BlockingIOError):  # the cancel connection is still open
                cancel.sock.recv(1)
            cancel.sock.setblocking(True)
            assert cancel.sock.recv(1) == b""  # closed once the cancel gave up
            waiting["thread"].join(10)
            assert waiting.get("rows") == [("next",)]
            row = pool_row(console)
            assert (
                row["sv_being_canceled"],
                row["sv_active_cancel"],
                row["cl_active_cancel_req"],
            ) == (0, 0, 0)
        finally:
            fault_proxy.stall_connects(False)
            cancel.close()
            owner.close()
