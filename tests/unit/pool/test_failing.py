"""Tests for pgtarn.pool.failing: login errors that will not pass, the backoff, the cached error."""

from __future__ import annotations

import pytest

from pgtarn.config.inifile import parse_config
from pgtarn.errors import PgtarnError
from pgtarn.pool.failing import CACHED_REFUSAL, retry_delay
from pgtarn.pool.lifetimes import reconnect

from .test_pool import INI, REFUSED, FakeClient, make_pool, make_registry, ready

WRONG_PASSWORD = PgtarnError('password authentication failed for user "user"', sqlstate="28P01")


def test_waiters_get_the_error_when_the_only_server_is_to_close() -> None:
    """PgBouncer's test_change_server_password_reconnect: the one server, held in a
    transaction, is to close when released (RECONNECT); the new server's login is refused:
    the waiting clients get PostgreSQL's error at once instead of waiting for the holder."""
    pool, _clock, launched = make_pool(pool_size=2)
    holder, first, second = FakeClient("holder"), FakeClient("first"), FakeClient("second")
    pool.acquire(holder)
    ready(pool, launched[0])
    reconnect(pool)
    pool.acquire(first)
    pool.acquire(second)
    assert len(pool.login) == 1
    pool.server_login_failed(launched[1], WRONG_PASSWORD, retry=False)
    assert first.error is WRONG_PASSWORD and second.error is WRONG_PASSWORD
    assert not pool.waiting and holder.error is None


@pytest.mark.parametrize("why", ["connection string", "server_lifetime"])
def test_servers_closed_at_release_serve_no_waiter(why: str) -> None:
    pool, clock, launched = make_pool(pool_size=2)
    holder, waiter = FakeClient("holder"), FakeClient("waiter")
    pool.acquire(holder)
    ready(pool, launched[0])
    if why == "connection string":
        pool.connstr = "elsewhere"
    else:
        pool.lifetime = 60.0
        clock.now += 61.0
    pool.acquire(waiter)
    pool.server_login_failed(launched[1], WRONG_PASSWORD, retry=False)
    assert waiter.error is WRONG_PASSWORD


def test_waiters_wait_for_a_server_that_will_serve_them() -> None:
    """As PgBouncer: with a server that goes back to the pool when released, its waiting
    clients are served by it rather than refused for a login that failed."""
    pool, _clock, launched = make_pool(pool_size=2)
    holder, waiter = FakeClient("holder"), FakeClient("waiter")
    pool.acquire(holder)
    ready(pool, launched[0])
    pool.acquire(waiter)
    pool.server_login_failed(launched[1], WRONG_PASSWORD, retry=False)
    assert waiter.error is None
    pool.release(launched[0])
    assert waiter.server is launched[0]


def _delays(retry: bool, login_retry: float) -> list[float]:
    """The delays between the attempts of a pool whose logins keep failing, a client asking
    for a server each time the delay passed."""
    pool, clock, launched = make_pool(pool_size=1)
    pool.login_retry = login_retry
    error = REFUSED if retry else WRONG_PASSWORD
    delays = []
    for _ in range(12):
        pool.acquire(FakeClient())
        assert len(pool.login) == 1  # one attempt at a time
        pool.server_login_failed(launched[-1], error, retry=retry)
        delays.append(round(pool.retry_at - clock.now, 2))
        clock.now = pool.retry_at
    return delays


def test_retries_back_off_to_server_login_retry_after_an_error_that_will_not_pass() -> None:
    """A wrong password is not retried once a second for ever (each attempt is one more
    FATAL in PostgreSQL's log): the delay doubles up to server_login_retry. A cause that may
    pass (connection refused) is still retried at most 1 s apart."""
    assert _delays(retry=False, login_retry=15.0) == pytest.approx(
        [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 15.0, 15.0, 15.0]
    )
    assert _delays(retry=True, login_retry=15.0)[-4:] == pytest.approx([1.0] * 4)


def test_the_delay_stops_doubling_long_before_it_overflows() -> None:
    assert retry_delay(1, 1.0) == 0.05
    assert retry_delay(5000, 15.0) == 15.0  # 0.05 * 2.0 ** 4999 would raise OverflowError


def test_a_client_arriving_between_refused_attempts_gets_the_cached_error() -> None:
    pool, clock, launched = make_pool(pool_size=2)
    pool.acquire(FakeClient())
    pool.server_login_failed(launched[0], WRONG_PASSWORD, retry=False)
    late, welcome = FakeClient("late"), FakeClient("welcome")
    pool.acquire(late)
    pool.wait_welcome(welcome)
    for client in (late, welcome):
        assert client.error is not None
        assert client.error.message == CACHED_REFUSAL.format(WRONG_PASSWORD.message)
        assert client.error.sqlstate == "28P01"
    assert len(launched) == 1 and not pool.waiting and not pool.welcome_waiters
    # once the backoff passed, a client gets an attempt of its own
    clock.now = pool.retry_at
    served = FakeClient("served")
    pool.acquire(served)
    assert served.error is None and len(launched) == 2
    ready(pool, launched[1])
    assert served.server is launched[1] and pool.failure is None
    assert pool.acquire(FakeClient()) is None and not pool.refused  # (waits: no cached error)


def test_a_cause_that_may_pass_has_no_cached_error() -> None:
    pool, _clock, launched = make_pool(pool_size=2)
    pool.acquire(FakeClient())
    pool.server_login_failed(launched[0], REFUSED, retry=True)
    late = FakeClient("late")
    pool.acquire(late)
    assert late.error is None and late in list(pool.waiting)


def test_reload_lets_a_failing_pool_try_again_at_once() -> None:
    registry, launched = make_registry(settings="server_login_retry = 15")
    pool = registry.get_pool(registry.config.databases["one"], "u")
    assert pool.login_retry == 15.0
    for _ in range(8):  # the backoff grew to seconds
        pool.acquire(FakeClient())
        pool.server_login_failed(launched[-1], WRONG_PASSWORD, retry=False)
    assert pool.retry_at - pool.clock() > 5
    registry.apply(parse_config(INI.format(db_opts="", settings="")))
    client = FakeClient()
    pool.acquire(client)
    assert client.error is None and len(pool.login) == 1
