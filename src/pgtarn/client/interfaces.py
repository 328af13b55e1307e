"""What the parts a client connection owns may ask of it: one typing.Protocol per part.

A part (the login, the LISTEN state, the session tracking) is an object of its own file,
made by the connection and handed the connection as one of these. The connection satisfies
them without naming them, and a test can hand a part any object that does. Calls through a
Protocol stay Python calls in the compiled build: the parts are off the path a transaction
takes (a client that changes no session state never calls its tracking). The link and the
relay (link.py, relay.py), which every client runs at every message, see it as the concrete
ClientTransport instead: compiled, its fields are then read as a C struct's.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ..config.settings import DatabaseEntry
from ..errors import PgtarnError
from ..net.tls import TlsTransport
from ..pool.pool import Pool
from ..runtime import Runtime
from ..server.connection import ServerConnection
from ..session.effects import Parsed
from ..session.framer import ClientFramer, Part
from ..session.prepared import ClientStatements
from ..session.tracking import SessionTracker
from ..views.states import ClientState


class LoginClient(Protocol):
    """What a client's login (login.py, passcheck.py) needs of its connection."""

    runtime: Runtime
    state: ClientState
    #: Who logs in to what, as the StartupMessage says; the database's entry (None: the
    #: admin console, or an unknown database, told after the password).
    user: str
    database: str
    db: DatabaseEntry | None
    #: A replication connection's kind ("physical", "logical"; "": none).
    replication: str
    #: Why pgtarn closes the connection, for the log line.
    close_reason: str

    @property
    def login(self) -> object:
        """The login the connection holds now (None once it ended): compared by identity."""

    @property
    def transport(self) -> asyncio.Transport | None:
        """The client's transport (None before it connected)."""

    @property
    def addr(self) -> str:
        """ "host:port" the client connected from, or "unix"."""

    @property
    def tls(self) -> TlsTransport | None:
        """The TLS layer once the client asked for TLS."""

    def write(self, data: bytes) -> None: ...

    def close(
        self, error: PgtarnError | None = None, response: bytes | None = None, reason: str = ""
    ) -> None: ...

    def same_os_user(self) -> bool:
        """A unix-socket peer running as the same OS user as this process."""

    def peer_os_user(self) -> str | None:
        """A unix-socket peer's OS user name (None over TCP)."""

    def wrap_tls(
        self,
        context: ssl.SSLContext,
        received: bytes,
        binding: bytes | None,
        on_ready: Callable[[], None],
        on_failed: Callable[[Exception], None],
    ) -> TlsTransport:
        """Put a TLS layer over the client's transport, which it then writes through."""

    def authenticated(self, scram_keys: tuple[bytes, bytes] | None, auth_ok: bytes) -> None:
        """The password exchange succeeded: on to the pool or the admin console (auth_ok:
        the exchange's last bytes, not sent yet)."""

    def cancel_request(self, key: tuple[int, int]) -> None:
        """The connection was a CancelRequest for the client with key."""


class ListenClient(Protocol):
    """What a client's LISTEN state (listening.py) needs of its connection: the stream's
    count of ReadyForQuery owed, the session state its LISTENs change, writes and close."""

    runtime: Runtime
    state: ClientState
    #: ReadyForQuery the client is owed (a reply answered here is one of them).
    expected: int
    #: Its ReadyForQuery need a look from the LISTEN state (replies owed, notifications).
    listening: bool
    #: Its session state is tracked (only then are LISTENs answered here).
    tracked: bool
    #: Its socket buffer is full: notifications wait.
    write_paused: bool

    @property
    def server(self) -> ServerConnection | None: ...

    @property
    def pool(self) -> Pool[ServerConnection] | None: ...

    @property
    def session(self) -> SessionTracker | None: ...

    @property
    def pending(self) -> Sequence[object]:
        """What the client sent that waits for a server."""

    def write(self, data: bytes) -> None: ...

    def close_flushing(self, error: PgtarnError, grace: float) -> None: ...

    def _close_after(self, server: ServerConnection | None, error: PgtarnError) -> None:
        """Close with error, or just close when server's reply went out only in part."""

    def _session_made(self) -> SessionTracker: ...

    def _session_ready(self, status: bytes) -> bool:
        """A ReadyForQuery with status ends a batch of the session (False: it closed)."""

    def _status_now(self) -> bytes:
        """The transaction status the client's next statement runs in."""

    def _send_pending(self) -> None:
        """What waited behind a withheld ReadyForQuery goes to a server now."""

    def _link_ends(self, server: ServerConnection, status: bytes) -> bytes | None:
        """Nothing more is owed: the link ends if the mode says so (b"": the client was
        closed)."""


class TrackedClient(Protocol):
    """What a client's session tracking (tracking.py) needs of its connection: the fields its
    texts are read with (its statements, its framer, its tracked parameters), the flags the
    relay reads at every message, its server, and the LISTEN replies it may owe."""

    runtime: Runtime
    #: Its session state is tracked (transaction and statement mode, track_session_state).
    tracked: bool
    #: Its session state keeps its server (set by the tracking at each ReadyForQuery).
    pinned: bool
    #: Its ReadyForQuery need a look from the LISTEN state (set for a LISTEN answered here).
    listening: bool
    #: Its tracked parameters, whose names a session's state leaves to ParameterStatus.
    params: dict[str, str]

    @property
    def framer(self) -> ClientFramer | None: ...

    @property
    def statements(self) -> ClientStatements | None: ...

    @property
    def server(self) -> ServerConnection | None: ...

    @property
    def pool(self) -> Pool[ServerConnection] | None: ...

    def close(
        self, error: PgtarnError | None = None, response: bytes | None = None, reason: str = ""
    ) -> None: ...

    def _status_now(self) -> bytes:
        """The transaction status the client's next statement runs in."""

    def _owe_answer(self, entry: list[Any]) -> None:
        """A LISTEN/UNLISTEN reply owed (listening.py), after those owed before it."""


class LargeClient(Protocol):
    """What a message passed on in pieces (large.py) needs of its connection: the relay's
    counts and flags, and its ways to a server."""

    runtime: Runtime
    framer: ClientFramer | None
    follows_statements: bool
    tracked: bool
    statement_mode: bool
    open_batch: bool
    unnamed_unbound: bool
    expected: int
    #: What waits for a server (bytes; in prepared-statement mode, parts and chunk).
    pending: list[bytes | tuple[list[Part] | None, bytes | None]]

    @property
    def statements(self) -> ClientStatements | None: ...

    @property
    def server(self) -> ServerConnection | None: ...

    def _start_statements(self) -> None: ...

    def _statements_ceded(self) -> None:
        """Its statements are its server's own from now on: its messages go as written."""

    def schema_change_sent(self) -> None: ...

    def _to_server(self, data: bytes) -> None: ...

    def _send_item(self, item: tuple[list[Part] | None, bytes | None], size: int) -> None: ...

    def _session_add(self, parsed: Parsed, replies_ahead: int, base: int) -> None: ...
