"""A replication connection's server: its client's own, never pooled, bytes passed as they are.

A client that logs in with ``replication=true`` (physical) or ``replication=database``
(logical) gets a server of its own, logged in with the pool's credentials and the client's
startup parameters (``replication`` among them). The pair lives and dies together: the
server is never lent to anyone else. It counts in its pool's pool_size, as in PgBouncer: the
client waits while the pool is full (pool/replication.py opens the server when there is
room, evicting an idle server of the pool if it has one). Once logged in,
every byte goes through untouched both ways (the walsender's CopyBoth stream has no
ReadyForQuery to act on). A login PostgreSQL refuses (a role without REPLICATION, no
pg_hba.conf entry) fails with PgBouncer's "login failed", PostgreSQL's SQLSTATE, and its
message as the DETAIL.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from time import monotonic
from typing import Protocol, Self

from ..config.settings import DatabaseEntry
from ..errors import PgtarnError
from ..net.sending import SEND_NEVER
from ..pool.pool import Pool
from ..pool.replication import replication_of
from ..proto import build
from ..proto.server_login import LOGIN_FAILED, LoggedIn
from ..runtime import Runtime
from .connection import ServerConnection
from .linked import LinkedClient
from .login import server_login_for
from .transport import log

#: PgBouncer's words for a replication login PostgreSQL refused (client and log).
REFUSED = "login failed"


class ReplicationClient(Protocol):
    """What a replication server needs of the client it was opened for."""

    def replication_ready(self, server: ReplicationServer, leftover: bytes) -> None:
        """The server is logged in; leftover: bytes PostgreSQL sent right behind its login."""

    def close(self, error: PgtarnError | None = None, response: bytes | None = None) -> None: ...

    def server_unavailable(self, error: PgtarnError) -> None:
        """It waited for room in its pool in vain (query_wait_timeout, shutdown)."""

    #: Its server, once there was room for it.
    server: ServerConnection | None


class ReplicationServer(ServerConnection):
    """A server connection dedicated to one replication client (see the module docstring)."""

    __slots__ = ("owner",)

    def __init__(
        self,
        runtime: Runtime,
        pool: Pool[ServerConnection],
        db: DatabaseEntry,
        owner: ReplicationClient,
        client_params: Mapping[str, str],
        mode: str,
    ) -> None:
        """mode: "physical" or "logical"; client_params: the client's startup parameters."""
        super().__init__(
            runtime, pool, db, server_login_for(runtime, pool, db, client_params=client_params)
        )
        self.replication = mode
        #: The client it logs in for, until the login ends.
        self.owner: ReplicationClient | None = owner

    def login_timed_out(self) -> None:
        """server_connect_timeout passed: a login still under way is given up on."""
        if self.login is not None and not self.closed:
            self.close("connect timeout (server_connect_timeout)")

    def _logged_in(self, result: LoggedIn) -> None:
        self.login = None
        self.params = result.params
        self.backend_key = result.backend_key
        if self.runtime.config.log_connections:
            log.info("%r new replication server connection", self)
        owner, self.owner = self.owner, None
        if owner is None:
            self.close("replication client left")
            return
        owner.replication_ready(self, result.leftover)

    def _login_refused(self, error: PgtarnError) -> None:
        """The login failed (PostgreSQL refused it: a role without REPLICATION, no
        pg_hba.conf entry; or pgtarn had no usable password): as PgBouncer, "login failed"
        for both sides, the cause in the log and the client's DETAIL; the pool's other
        logins are not failed for it."""
        self.login = None
        cause = error.message.removeprefix(LOGIN_FAILED)
        log.warning("%r %s%s", self, LOGIN_FAILED, cause)
        self.close(f"{REFUSED} (age={monotonic() - self.created_at:.0f}s)")
        owner, self.owner = self.owner, None
        if owner is not None:
            owner.close(
                PgtarnError(REFUSED, sqlstate=error.sqlstate, severity="FATAL"),
                build.error_response(error.sqlstate, REFUSED, "FATAL", cause),
            )
        self._gone()

    def _login_failed(self, error: PgtarnError) -> None:
        """No login (no connection, server_connect_timeout, lost): its client gets why."""
        if self.runtime.config.log_pooler_errors:
            log.warning("%r %s", self, error.message)
        owner, self.owner = self.owner, None
        if owner is not None:
            owner.close(error)
        self._gone()

    def connection_lost(self: Self, exc: Exception | None) -> None:
        """Its place in the pool is free once PostgreSQL's end is gone too (the pool's own
        servers' accounting, server_closed, is not for it)."""
        if self.login is not None:
            super().connection_lost(exc)  # (its login failed: _login_failed)
            return
        was_closed = self.closed
        self.closed = True
        self.send_state = SEND_NEVER
        client, self.client = self.client, None
        if client is not None:
            client.server_lost(self)
            if not was_closed and self.runtime.config.log_disconnections:
                log.info("%r closing because: server connection lost", self)
        self._gone()

    def _gone(self) -> None:
        """Out of its pool's count: the next waiting replication client may have its place."""
        replication = self.pool.replication
        if replication is not None:
            replication.gone(self)

    def data_received(self, data: bytes) -> None:
        if self.login is not None:
            super().data_received(data)
            return
        client = self.client
        if client is not None:
            client.write(data)

    def release_from(
        self,
        client: LinkedClient[ServerConnection],
        mid_query: bool,
        reset_query: str | None,
        settings: dict[str, str] | None = None,
        *,
        reason: str = "",
    ) -> None:
        """Its client left (logged in or not): the pair ends together."""
        self.client = None
        self.owner = None
        self.close("replication client left")


def request_replication(
    runtime: Runtime,
    pool: Pool[ServerConnection],
    db: DatabaseEntry,
    owner: ReplicationClient,
    client_params: Mapping[str, str],
    mode: str,
) -> None:
    """Open owner's replication server (its owner.server) as soon as its pool has room."""

    def open_server() -> ServerConnection:
        server = owner.server = ReplicationServer(runtime, pool, db, owner, client_params, mode)
        server.start_connecting()
        timeout = runtime.config.server_connect_timeout
        if timeout > 0:  # no pool's janitor watches this login: its own timer does
            asyncio.get_running_loop().call_later(timeout, server.login_timed_out)
        return server

    replication_of(pool).request(owner, open_server)
