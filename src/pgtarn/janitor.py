"""The one periodic loop's work: every timeout and lifetime, checked against a monotonic clock.

No connection has a timer of its own: every JANITOR_INTERVAL the janitor visits the pools
(server lifetimes, idle servers, login and wait timeouts, retries, min_pool_size) and then the
clients. A timeout fires at most one interval late and never early, whatever the wall clock
does, because every instant compared here comes from ``time.monotonic()``.

What a client gets: PgBouncer's words and SQLSTATE for PgBouncer's own timeouts (a client
of PgBouncer's matches them), PostgreSQL's where PostgreSQL has the same timeout:

| setting | the client gets |
|---|---|
| query_timeout | FATAL 08P01 "query timeout (query_timeout = N s)"; its server is closed, a
  CancelRequest sent for the query; still waiting for a server: "query_timeout: ..." (the
  pool's tick, pool/waits.py) |
| transaction_timeout | FATAL 08P01 "transaction timeout (...)"; mid-query, as query_timeout;
  otherwise its server rolls back and is reused |
| idle_transaction_timeout | FATAL 08P01 "idle transaction timeout (...)"; rolled back |
| client_idle_timeout | FATAL 57P05 (as idle_session_timeout) |
| client_login_timeout | FATAL 08P01, before or during authentication |
| query_wait_timeout | FATAL 08P01 (the pool's tick) |
"""

from __future__ import annotations

import logging
from typing import Any

from .errors import PgtarnError
from .pool.pool import Pool
from .runtime import Runtime
from .views.protocols import ClientView, ServerView
from .views.states import LOGGING_IN, ClientState

log = logging.getLogger("pgtarn.janitor")

JANITOR_INTERVAL = 0.1


#: PgBouncer's words first (its clients and log readers match them), then the setting.
QUERY_TIMEOUT = "query timeout (query_timeout = {:g} s)"
TRANSACTION_TIMEOUT = "transaction timeout (transaction_timeout = {:g} s)"
IDLE_TRANSACTION_TIMEOUT = "idle transaction timeout (idle_transaction_timeout = {:g} s)"


def _fatal(sqlstate: str, text: str, seconds: float) -> PgtarnError:
    return PgtarnError(text.format(seconds), sqlstate=sqlstate, severity="FATAL")


def _end_mid_query(client: ClientView, server: ServerView, text: str, seconds: float) -> None:
    """A timeout ends client while its query runs: the client, then its server (cancelled
    and closed with the same reason, as PgBouncer closes both)."""
    error = _fatal("08P01", text, seconds)
    client.timed_out(error)
    server.abandon(error.message)


def _fast_close(client: ClientView) -> bool:
    """server_fast_close, session mode: a server to close (RECONNECT, or a reload changed its
    connection string) goes as soon as its transaction has ended, and its client with it;
    True if so."""
    server = client.server
    if server is None or not server.close_needed or client.query_start or server.status != b"I":
        return False
    client.timed_out(
        PgtarnError(
            "database configuration changed (server_fast_close)", sqlstate="08P01", severity="FATAL"
        )
    )
    return True


class Janitor:
    """Visits every pool and every client once per tick."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        #: (database, user) -> since when the pool has had nothing (pool_idle_timeout).
        self.empty_since: dict[tuple[str, str], float] = {}

    def tick(self, now: float) -> None:
        if self.runtime.suspended:
            return  # SUSPEND: pgtarn itself stopped reading; nobody is to blame for waiting
        registry = self.runtime.registry
        registry.tick(now)
        config = self.runtime.config
        self.visit_clients(now)
        if config.autodb_idle_timeout > 0:
            for pool in registry:
                if not pool.auto:
                    continue
                if pool.logged_in or pool.welcome_waiters:
                    # idle time counts from the last client leaving, not from the last
                    # acquire: a session client can hold its server for hours
                    pool.last_used = now
                elif not pool.busy and now - pool.last_used > config.autodb_idle_timeout:
                    self._free(pool, "autodb_idle_timeout")
        if config.pool_idle_timeout > 0:
            self._drop_empty_pools(now, config.pool_idle_timeout)

    def _drop_empty_pools(self, now: float, timeout: float) -> None:
        """pool_idle_timeout: a pool with no clients, no servers and no listener connection
        for that long is dropped (not one with min_pool_size: it is to keep servers)."""
        empty_since = self.empty_since
        seen: set[tuple[str, str]] = set()
        for pool in self.runtime.registry:
            key = (pool.database, pool.user)
            if (
                pool.logged_in
                or pool.welcome_waiters
                or pool.server_count
                or pool.min_pool_size
                or (pool.board is not None and pool.board.open_links)
            ):
                continue
            seen.add(key)
            since = empty_since.setdefault(key, now)
            if now - since > timeout:
                self._free(pool, "pool_idle_timeout")
                seen.discard(key)
        for key in [k for k in empty_since if k not in seen]:
            del empty_since[key]

    def _free(self, pool: Pool[Any], reason: str) -> None:
        log.info("%s/%s: cleaning up idle pool (%s)", pool.database, pool.user, reason)
        self.runtime.registry.free(pool)

    def visit_clients(self, now: float) -> None:
        """Apply the client timeouts."""
        config = self.runtime.config
        login_timeout = config.client_login_timeout
        fast_close = config.server_fast_close
        if fast_close or any(pool.client_timeouts.any for pool in self.runtime.registry):
            clients = tuple(self.runtime.clients.values())
        elif login_timeout > 0:
            # nothing to check on a logged-in client: the logins only (a visit of thousands
            # of idle clients ten times a second was most of a connect storm's CPU)
            clients = tuple(self.runtime.logins)
        else:
            return
        for client in clients:
            state = client.state
            if state is ClientState.READY:
                pool = client.pool
                assert pool is not None
                if fast_close and pool.pool_mode == "session" and _fast_close(client):
                    continue
                timeouts = pool.client_timeouts
                if timeouts.any:
                    self._ready_client(
                        client,
                        now,
                        timeouts.query,
                        timeouts.transaction,
                        timeouts.idle_transaction,
                        timeouts.idle,
                    )
            elif state in LOGGING_IN and 0 < login_timeout < now - client.created_at:
                client.timed_out(
                    _fatal(
                        "08P01",
                        "client_login_timeout: login not completed in {:g} s",
                        login_timeout,
                    )
                )

    @staticmethod
    def _ready_client(
        client: ClientView,
        now: float,
        query: float,
        transaction: float,
        idle_transaction: float,
        idle: float,
    ) -> None:
        server = client.server
        started = client.query_start
        if started and server is not None:  # a query runs
            if query and now - started > query:
                _end_mid_query(client, server, QUERY_TIMEOUT, query)
            elif transaction and now - (client.xact_start or started) > transaction:
                _end_mid_query(client, server, TRANSACTION_TIMEOUT, transaction)
        elif started:
            return  # waiting for a server: its pool's business (pool/waits.py)
        elif server is not None and server.status != b"I":  # idle in transaction
            if idle_transaction and now - client.idle_since > idle_transaction:
                client.timed_out(_fatal("08P01", IDLE_TRANSACTION_TIMEOUT, idle_transaction))
            elif transaction and client.xact_start and now - client.xact_start > transaction:
                client.timed_out(_fatal("08P01", TRANSACTION_TIMEOUT, transaction))
        elif idle and now - client.idle_since > idle:
            client.timed_out(
                _fatal("57P05", "client_idle_timeout: idle for longer than {:g} s", idle)
            )
