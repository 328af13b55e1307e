"""What the runtime, the janitor and the admin console see of connections: typing.Protocols.

Client and server connections live in the layers above; the layers below (the runtime,
admin, janitor) hold and read them only through these views, so no import runs upwards.
Members are read-only properties where the connection's own field has a narrower type.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ..errors import PgtarnError
from ..pool.pool import Pool
from ..session.prepared import ClientStatements, ServerStatements
from .states import ClientState


class ServerView(Protocol):
    """A connection to PostgreSQL, as SHOW SERVERS, the janitor and KILL see it."""

    # what the pool sees of it too (PooledServer)
    connstr: str
    created_at: float
    last_used: float
    close_needed: bool
    id: int
    peer: str
    local_addr: str
    connect_time: float
    backend_key: tuple[int, int]
    params: dict[str, str]
    replication: str  # "physical", "logical", or "" (a pool's server)
    #: The (host, port) it connected to, of its entry's list (("", 0) until connected).
    target: tuple[str, int]

    @property
    def pool(self) -> Pool[Any]: ...

    @property
    def client(self) -> object | None:
        """The client it is lent to, if any (shown as a pointer only)."""

    @property
    def statements(self) -> ServerStatements | None: ...

    @property
    def status(self) -> bytes:
        """The transaction status of its last ReadyForQuery (I, T or E)."""

    @property
    def transport(self) -> asyncio.Transport | None: ...

    def close(self, reason: str, wait: bool = False) -> None: ...

    def start_check(self) -> None: ...

    def abandon(self, reason: str) -> None:
        """Its client was closed mid-query: close, with a CancelRequest for its backend."""

    def send_cancel(self, client: ClientView, done: Callable[[], None] | None = None) -> None:
        """Cancel what this server runs for client, if it still runs client's work; done is
        called when the cancel is over (and the server is not lent to anyone until then)."""


class ClientView(Protocol):
    """An application connection, as SHOW CLIENTS, the janitor and KILL see it."""

    id: int
    user: str
    database: str
    params: dict[str, str]
    cancel_key: tuple[int, int]
    joined: bool  # logged in to its pool (counted in Pool.logged_in)
    replication: str  # "physical", "logical", or "" (not a replication connection)

    @property
    def connect_time(self) -> float:
        """Wall clock of the connect (display)."""

    @property
    def peer_pid(self) -> int:
        """The process id of a unix-socket peer (0 over TCP)."""

    @property
    def addr(self) -> str:
        """The address it connected from, "host:port" ("unix" over a unix socket)."""

    @property
    def local_addr(self) -> str:
        """The address it connected to, "host:port" ("" over a unix socket)."""

    @property
    def state(self) -> ClientState: ...

    @property
    def pool(self) -> Pool[Any] | None: ...

    @property
    def server(self) -> ServerView | None: ...

    @property
    def waiting(self) -> bool:
        """Queued for a server of its pool."""

    @property
    def statements(self) -> ClientStatements | None: ...

    @property
    def transport(self) -> asyncio.Transport | None: ...

    @property
    def tls(self) -> asyncio.Transport | None: ...

    @property
    def created_at(self) -> float: ...

    @property
    def idle_since(self) -> float: ...

    @property
    def query_start(self) -> float: ...

    @property
    def xact_start(self) -> float: ...

    @property
    def last_request(self) -> float: ...

    def pin_reasons(self) -> list[str]:
        """Why its session state keeps its server (empty: it does not)."""

    def tracked_settings(self) -> list[str]:
        """The names of the session settings it changed (never their values)."""

    def timed_out(self, error: PgtarnError) -> None:
        """A timeout ends the client with error."""

    def close(
        self, error: PgtarnError | None = None, response: bytes | None = None, reason: str = ""
    ) -> None:
        """Send error (if any) and close; reason: why, for the log, when none is sent."""


class SecretSource(Protocol):
    """auth_query: where secrets of users missing from auth_file are looked up."""

    def secret(self, user: str) -> Awaitable[str | None]:
        """The user's secret: None when there is no such user, "" when it has none."""
        ...

    def forget(self, user: str) -> None:
        """A login failed with the cached secret: look it up again next time."""

    def retire(self) -> None:
        """Replaced by a RELOAD: answer what was asked, then close."""

    def close(self) -> None: ...
