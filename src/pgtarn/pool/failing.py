"""A failing pool's rules: the delay between attempts, who still serves, the cached error."""

from __future__ import annotations

from ..errors import PgtarnError
from .state import PoolState, Unavailable

FIRST_RETRY_DELAY = 0.05
#: The delay stops doubling here: far past any cap, and 2.0 ** 1024 would overflow.
MAX_RETRY_DOUBLINGS = 16
#: A client that arrives while logins fail for good and nothing is to come (PgBouncer's words).
CACHED_REFUSAL = "server login has been failing, cached error: {} (server_login_retry)"


def retry_delay(failures: int, cap: float) -> float:
    """Seconds before the next attempt after `failures` failed ones in a row (at least 1):
    FIRST_RETRY_DELAY, doubling, at most cap."""
    return min(cap, FIRST_RETRY_DELAY * 2.0 ** min(max(0, failures - 1), MAX_RETRY_DOUBLINGS))


def serves_waiters(pool: PoolState, now: float) -> bool:
    """Some established server will go to pool's waiting clients: an idle one, or one that
    is not to be closed when released (RECONNECT, a new connection string, past
    server_lifetime)."""
    connstr = pool.connstr
    if any(not s.close_needed and s.connstr == connstr for s in pool.idle):
        return True
    for servers in (pool.active, pool.tested, pool.being_canceled):
        for server in servers:
            if not server.close_needed and server.connstr == connstr \
                    and now - server.created_at <= pool.lifetime:  # fmt: skip
                return True
    return False


def login_failed(pool: PoolState, server: object, error: PgtarnError, retry: bool) -> None:
    """A server of pool could not connect or log in.

    retry: the cause may pass (refused, timed out, TLS, PostgreSQL starting or shutting
    down); clients keep waiting while the pool retries, at most retry_cap apart, until
    their timeouts (waits.py). Otherwise (wrong
    password, no such database) waiting clients get the error at once unless a server will
    come back to serve them, and retries back off up to login_retry: the same error once a
    second would only fill PostgreSQL's log.
    """
    now = pool.clock()
    pool.login.discard(server)
    pool.failure = error
    pool.failures += 1
    pool.refused = not retry
    pool.retry_at = now + retry_delay(pool.failures, pool.retry_cap if retry else pool.login_retry)
    if pool.split is not None:
        pool.split.login_failed(pool.host_index, error.message)
    if not retry and not serves_waiters(pool, now):
        pool.fail_waiters(error, now)


def give_up(pool: PoolState, now: float) -> None:
    """The janitor, while pool fails (not paused) and has no query_wait_timeout (waits.py):
    with no established server to come free for them, its clients get the error once they
    waited connect_timeout (while servers run, they are served as those are released)."""
    failure = pool.failure
    if failure is None or serves_waiters(pool, now):
        return
    pool.fail_waiters(failure, now - pool.connect_timeout)


def refused_from_cache(pool: PoolState, waiter: Unavailable, now: float) -> bool:
    """A client asks failing pool for a server: it gets the cached error (True) when the
    logins fail for good and neither an attempt nor a server is to come before the next
    retry; else it may wait (False)."""
    failure = pool.failure
    if failure is None or not pool.refused or pool.login or now >= pool.retry_at \
            or pool.paused or serves_waiters(pool, now):  # fmt: skip
        return False
    waiter.server_unavailable(
        PgtarnError(
            CACHED_REFUSAL.format(failure.message), sqlstate=failure.sqlstate, severity="FATAL"
        )
    )
    return True
