"""Tests for pgtarn.pool.waits: query_timeout and query_wait_timeout on waiting clients, and
how long a failing pool's clients wait."""

from __future__ import annotations

from pgtarn.pool.pool import ClientTimeouts

from .test_pool import REFUSED, FakeClient, make_pool, ready


def test_a_failing_pools_clients_wait_for_query_wait_timeout_not_server_connect_timeout() -> None:
    """As PgBouncer: a connect that fails (refused, timed out, TLS) does not end the waiting
    clients; the pool retries, and they end at query_wait_timeout, told the last error."""
    pool, clock, launched = make_pool(pool_size=1)
    pool.connect_timeout, pool.wait_timeout = 2.0, 5.0
    waiter, welcome = FakeClient("waiter"), FakeClient("welcome")
    pool.acquire(waiter)
    pool.wait_welcome(welcome)
    pool.server_login_failed(launched[0], REFUSED, retry=True)
    clock.now += 4.9  # past server_connect_timeout
    pool.tick(clock.now)
    assert waiter.error is None and welcome.error is None
    assert len(launched) > 1  # retried meanwhile
    clock.now += 0.2
    pool.tick(clock.now)
    for client in (waiter, welcome):
        assert client.error is not None
        assert (client.error.sqlstate, client.error.severity) == ("08P01", "FATAL")
        assert client.error.message == (
            "query_wait_timeout: no server connection became free "
            f"in 5 s (last error: {REFUSED.message})"
        )
    assert not pool.waiting and not pool.welcome_waiters


def test_without_query_wait_timeout_a_failing_pool_errs_after_server_connect_timeout() -> None:
    """query_wait_timeout = 0 waits for ever for a server of a pool that works; for one that
    cannot be reached, server_connect_timeout bounds the wait (no client hangs)."""
    pool, clock, launched = make_pool(pool_size=1)
    pool.connect_timeout, pool.wait_timeout = 2.0, 0.0
    waiter = FakeClient()
    pool.acquire(waiter)
    pool.server_login_failed(launched[0], REFUSED, retry=True)
    clock.now += 1.9
    pool.tick(clock.now)
    assert waiter.error is None
    clock.now += 0.2
    pool.tick(clock.now)
    assert waiter.error is REFUSED


def test_without_query_wait_timeout_a_pool_that_works_keeps_its_clients_waiting() -> None:
    pool, clock, launched = make_pool(pool_size=1)
    pool.wait_timeout = 0.0
    holder, waiter = FakeClient("holder"), FakeClient("waiter")
    pool.acquire(holder)
    ready(pool, launched[0])
    pool.acquire(waiter)
    clock.now += 3600.0
    pool.tick(clock.now)
    assert waiter.error is None and list(pool.waiting) == [waiter]


def test_query_timeout_ends_a_wait_for_a_server_before_query_wait_timeout() -> None:
    """As PgBouncer's janitor: query_timeout counts from when the query came, its wait for a
    server included; a client still waiting then is closed with "query_timeout"."""
    pool, clock, launched = make_pool(pool_size=1)
    pool.client_timeouts = ClientTimeouts(query=3.0)
    pool.wait_timeout = 5.0
    holder, first, later = FakeClient("holder"), FakeClient("first"), FakeClient("later")
    pool.acquire(holder)
    ready(pool, launched[0])
    pool.acquire(first)
    clock.now += 1.0
    pool.acquire(later)
    clock.now += 2.1  # first waited 3.1 s, later 2.1 s
    pool.tick(clock.now)
    assert first.error is not None and later.error is None
    assert (first.error.sqlstate, first.error.severity) == ("08P01", "FATAL")
    assert first.error.message == "query_timeout: no server connection in 3 s"
    assert list(pool.waiting) == [later]
    holder_server = holder.server
    assert holder_server is not None
    pool.release(holder_server)
    assert later.server is holder_server
