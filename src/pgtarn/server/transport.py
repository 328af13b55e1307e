"""The fields of a server connection and its asyncio glue: writes and flow control."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Self

from ..config.settings import DatabaseEntry
from ..net.sending import SEND_NEVER, send
from ..net.sockets import Target
from ..pool.pool import Pool, PooledServer
from ..proto.framing import MessageScanner
from ..proto.msgtypes import SERVER_RELAY_TYPES
from ..runtime import Runtime
from ..session.prepared import ServerStatements
from ..session.tracking import NO_SETTINGS
from .linked import LinkedClient
from .login import LoginDriver
from .longreply import LongReply

log = logging.getLogger("pgtarn.server")


class ServerTransport(PooledServer, asyncio.Protocol):
    """A connection to PostgreSQL: its fields and its asyncio glue (the base of
    ServerConnection, see connection.py).

    The fields of every part of the connection (login, relay, link) are declared here, in
    one __slots__, but for the six the pool reads (in its base, PooledServer). The linked
    client is a LinkedClient of the connection's own type (Self): the methods that hand
    ``self`` to it are annotated ``self: Self`` for that.
    """

    __slots__ = (
        "backend_key",
        "client",
        "closed",
        "connect_time",
        "db",
        "fatal",
        "hosts_tried",
        "id",
        "internal_error",
        "local_addr",
        "login",
        "long_reply",
        "on_clean",
        "params",
        "params_met",
        "peer",
        "pool",
        "replication",
        "runtime",
        "scanner",
        "send_state",
        "settings",
        "stale_links",
        "statements",
        "status",
        "swallow",
        "swallow_syncs",
        "target",
        "transport",
    )

    def __init__(self, runtime: Runtime, pool: Pool[Any], db: DatabaseEntry) -> None:
        self.runtime = runtime
        self.pool = pool
        self.db = db
        self.id = next(runtime.ids)
        self.connstr = pool.connstr
        #: The login in progress; None once logged in, or given up on.
        self.login: LoginDriver | None = None
        self.transport: asyncio.Transport | None = None
        #: How write sends: straight to the socket, or through the transport (net/sending.py).
        self.send_state = SEND_NEVER
        config = runtime.config
        # (a long ErrorResponse is read by its head only: the relay passes every chunk on)
        self.scanner = MessageScanner(
            SERVER_RELAY_TYPES,
            config.max_packet_size,
            stream_over=config.client_message_buffer,
            heads=True,
        )
        self.client: LinkedClient[Self] | None = None
        #: A reply too long to hold, on its way in pieces (prepared statements kept).
        self.long_reply: LongReply | None = None
        self.params: dict[str, str] = {}
        #: The client parameters (a client's dict) that params was last found to hold, so that
        #: the next link of that client compares nothing. A client's dict is replaced when a
        #: value changes, never written (ClientLink.parameter_changed); None: compare again.
        self.params_met: dict[str, str] | None = None
        self.backend_key: tuple[int, int] = (0, 0)
        self.status = b"I"
        #: The session settings its last client left, as the SQL that set them (a client's
        #: dict, shared: see session/tracking.py).
        self.settings = NO_SETTINGS
        #: ReadyForQuery messages still to come whose replies are ours, not a client's.
        self.swallow = 0
        #: Of the swallowed ReadyForQuery, how many end a batch the statements track.
        self.swallow_syncs = 0
        self.on_clean: Callable[[], None] | None = None
        #: (SQLSTATE, message) of the last ErrorResponse to pgtarn's own queries.
        self.internal_error: tuple[str, str] | None = None
        #: Prepared statements this server has (transaction mode), made on first use.
        self.statements: ServerStatements | None = None
        self.closed = False
        #: Inside its data_received: a release hands it off at the end (pool/handoffs.py).
        self.in_read = False
        self.handoff_at = 0.0
        self.close_needed = False
        #: The message of a FATAL (or PANIC) PostgreSQL sent while linked: the client
        #: already knows why the server is about to go away.
        self.fatal = ""
        self.created_at = time.monotonic()
        self.last_used = self.created_at
        self.connect_time = time.time()  # for display only
        self.peer = ""
        self.local_addr = ""
        #: The host and port of the entry's list it connected to (its cancels go there).
        self.target: Target = ("", 0)
        #: target_session_attrs: the hosts (indexes in the entry's list) whose login did not
        #: fit, and the connections to them closed whose connection_lost is still to come.
        self.hosts_tried: set[int] = set()
        self.stale_links = 0
        #: A replication client's own server: "physical" or "logical" ("": a pool's).
        self.replication = ""

    def __repr__(self) -> str:
        # PgBouncer's layout, which log readers parse: "S-id: database/user@host:port"
        return f"S-{self.id}: {self.pool.database}/{self.pool.user}@{self.peer}"

    @property
    def at_boundary(self) -> bool:
        """No reply is partly relayed (a message begun, or a long one under way)."""
        return self.scanner.at_boundary and self.long_reply is None

    def write(self, data: bytes) -> None:
        transport = self.transport
        assert transport is not None
        self.send_state = send(self.send_state, transport, data)

    # --- flow control: a slow PostgreSQL stops the linked client from sending more ------------

    def pause_writing(self) -> None:
        client = self.client
        if client is not None:
            client.pause_reading()

    def resume_writing(self) -> None:
        client = self.client
        if client is not None:
            client.resume_reading()

    def pause_reading(self) -> None:
        """The linked client reads too slowly: stop reading PostgreSQL's replies."""
        transport = self.transport
        if transport is not None:
            transport.pause_reading()

    def resume_reading(self) -> None:
        transport = self.transport
        if transport is not None:
            transport.resume_reading()
