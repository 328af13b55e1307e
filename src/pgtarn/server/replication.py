"""A replication connection's server: its client's own, never pooled, bytes passed as they are.

A client that logs in with ``replication=true`` (physical) or ``replication=database``
(logical) gets a server of its own, logged in with the pool's credentials and the client's
startup parameters (``replication`` among them). The pair lives and dies together: the
server is never lent to anyone else, nor counted in the pool's servers. Once logged in,
every byte goes through untouched both ways (the walsender's CopyBoth stream has no
ReadyForQuery to act on). A login PostgreSQL refuses (a role without REPLICATION, no
pg_hba.conf entry) reaches the client with PostgreSQL's SQLSTATE and message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

from ..config import DatabaseEntry
from ..errors import PgtarnError
from ..pool.pool import Pool
from ..proto.server_login import LoggedIn
from ..runtime import Runtime
from .connection import ServerConnection
from .login import server_login_for
from .transport import LinkedClient, log


class ReplicationClient(Protocol):
    """What a replication server needs of the client it was opened for."""

    def replication_ready(self, server: ReplicationServer, leftover: bytes) -> None:
        """The server is logged in; leftover: bytes PostgreSQL sent right behind its login."""

    def close(self, error: PgtarnError | None = None, response: bytes | None = None) -> None:
        ...


class ReplicationServer(ServerConnection):
    """A server connection dedicated to one replication client (see the module docstring)."""

    __slots__ = ("owner",)

    def __init__(self, runtime: Runtime, pool: Pool[ServerConnection], db: DatabaseEntry,
                 owner: ReplicationClient, client_params: Mapping[str, str], mode: str) -> None:
        """mode: "physical" or "logical"; client_params: the client's startup parameters."""
        super().__init__(runtime, pool, db,
                         server_login_for(runtime, pool, db, client_params=client_params))
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

    def _login_failed(self, error: PgtarnError) -> None:
        """PostgreSQL refused (or never answered): its client gets PostgreSQL's own words."""
        if self.runtime.config.log_pooler_errors:
            log.warning("%r %s", self, error.message)
        owner, self.owner = self.owner, None
        if owner is not None:
            owner.close(error)

    def data_received(self, data: bytes) -> None:
        if self.login is not None:
            super().data_received(data)
            return
        client = self.client
        if client is not None:
            client.write(data)

    def release_from(self, client: LinkedClient[ServerConnection], mid_query: bool,
                     reset_query: str | None, settings: dict[str, str] | None = None, *,
                     reason: str = "") -> None:
        """Its client left (logged in or not): the pair ends together."""
        self.client = None
        self.owner = None
        self.close("replication client left")


def open_replication(runtime: Runtime, pool: Pool[ServerConnection], db: DatabaseEntry,
                     owner: ReplicationClient, client_params: Mapping[str, str], mode: str
                     ) -> ReplicationServer:
    """Create owner's replication server and start connecting it in the background."""
    server = ReplicationServer(runtime, pool, db, owner, client_params, mode)
    server.start_connecting()
    timeout = runtime.config.server_connect_timeout
    if timeout > 0:  # no pool's janitor watches this login: its own timer does
        asyncio.get_running_loop().call_later(timeout, server.login_timed_out)
    return server
