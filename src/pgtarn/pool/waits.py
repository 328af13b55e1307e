"""When a pool gives up on its waiting clients: query_timeout, query_wait_timeout, a failing pool.

As PgBouncer's janitor: a client waiting for a server (or for the first server's welcome)
longer than query_timeout is closed with "query_timeout", and one waiting longer than
query_wait_timeout with "query_wait_timeout" (both also while the pool is paused: only
SUSPEND stops the clock). A failing pool keeps its waiters through errors that may pass (a
refused or timed-out connect, TLS, PostgreSQL starting up) while it retries: they end at those
timeouts, the last error named. Only with query_wait_timeout = 0 do they get the last error
after server_connect_timeout instead, so that no client waits for ever for a server that
cannot be reached. (An error that will not pass reaches them at once: failing.py.)
"""

from __future__ import annotations

from ..errors import PgtarnError
from .failing import give_up
from .state import PoolState

#: query_wait_timeout: closes the client as PgBouncer does (class 08: the connection is gone).
WAIT_TIMEOUT = "query_wait_timeout: no server connection became free in {:g} s"
#: query_timeout, for a query still waiting for a server: PgBouncer's word first.
QUERY_WAIT_TIMEOUT = "query_timeout: no server connection in {:g} s"


def expire_waiters(pool: PoolState, now: float) -> None:
    """The janitor's visit: close the clients that waited too long (see the module)."""
    query = pool.client_timeouts.query
    if query > 0 and pool.max_wait(now) > query:
        pool.fail_waiters(_timeout(pool, QUERY_WAIT_TIMEOUT, query), now - query)
    wait = pool.wait_timeout
    if wait > 0:
        if pool.max_wait(now) > wait:
            pool.fail_waiters(_timeout(pool, WAIT_TIMEOUT, wait), now - wait)
    elif pool.failure is not None and not pool.paused:
        give_up(pool, now)


def _timeout(pool: PoolState, text: str, seconds: float) -> PgtarnError:
    message = text.format(seconds)
    if pool.failure is not None:  # why no server came: the last attempt's error
        message += f" (last error: {pool.failure.message})"
    return PgtarnError(message, sqlstate="08P01", severity="FATAL")
