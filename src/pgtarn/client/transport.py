"""The asyncio glue of a client connection: its fields, transport, writes, close, flow control."""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from collections.abc import Callable
from sys import intern
from time import monotonic
from typing import Final, cast

from ..admin.console import AdminSession
from ..config.settings import DatabaseEntry
from ..errors import PgtarnError
from ..net.sending import SEND_NEVER, send, send_state_of
from ..net.sockets import address, tune
from ..net.tls import TlsTransport
from ..pool.pool import Pool
from ..pool.split import ClientRoute
from ..proto import build
from ..proto.framing import shared_scanner
from ..runtime import Runtime
from ..server.connection import ServerConnection
from ..server.linked import LinkedClient
from ..session.framer import ClientFramer, Part
from ..session.prepared import ClientStatements
from ..session.tracking import SessionTracker
from ..views.protocols import ClientView
from ..views.states import ClientState
from .access import os_user_name, peer_credentials
from .extras import ClientExtras
from .large import ClientLargeMessage
from .listening import NO_CHANNELS, ClientListen
from .tracking import SessionTracking

log = logging.getLogger("pgtarn.client")

#: What a prepared-statement client sent: (parts, the chunk when the parts are all of it);
#: parts None: one whole Query.
PendingParts = tuple[list[Part] | None, bytes | None]
#: A client's tracked parameters before its welcome (shared, never written).
NO_PARAMS: dict[str, str] = {}
#: Shared by every client holding no bytes for a server; never written (ClientLink.hold makes a
#: client's own list at its first item).
NO_PENDING: Final[list[bytes | PendingParts]] = []
#: The cancel key of a client that has none yet.
NO_KEY: Final[tuple[int, int]] = (0, 0)
#: The scanner a client holds until its welcome (it watches nothing, its bytes go to the login).
_WATCH_NOTHING: frozenset[int] = frozenset()
#: Every client's scanner until its welcome: made once, not looked up at each login.
_SCANNER_UNTIL_WELCOME: Final = shared_scanner(_WATCH_NOTHING)


class ClientTransport(LinkedClient[ServerConnection]):
    """An application connection's fields and its asyncio glue (the base of ClientConnection).

    Thousands of these may sit idle: no per-instance dict. The fields the link and the relay
    work on (link.py, relay.py: parts without fields of their own) are declared here, in one
    __slots__; the parts the connection owns (its login, its session tracking, its LISTEN
    state, its extras) are objects of their own, held in one field each and made when
    needed.

    Long: every field of a client is declared here, beside the writes, the close and the flow
    control that use them; the behaviour lives in the parts.
    """

    __slots__ = ("cancel_key", "created_at", "database", "db", "expected",
                 "extras", "follows_statements", "framer", "id", "idle_since", "joined", "large",
                 "last_request", "listen", "listening",
                 "open_batch", "params", "peer_host", "peer_port",
                 "pending", "pending_size", "pinned", "pool", "query_start", "route",
                 "runtime", "scanner", "send_state", "server", "session_mode", "state",
                 "statement_mode", "tracked", "tracking", "transport",
                 "unnamed_unbound", "user", "wait_notified", "waiting", "write_paused",
                 "xact_start")  # fmt: skip

    def __init__(self, runtime: Runtime) -> None:
        # The flags first: compiled, the fields are laid out in the order first assigned here,
        # and these one-byte fields side by side take 16 bytes where, spread among the
        # pointers, they took 48 (a few thousand idle clients).
        #: Waiting for a server from the pool; told it waits long (the notice, once).
        self.waiting = False
        self.wait_notified = False
        #: Its pool's mode, fixed at its login (a RELOAD changes the pool's for later clients):
        #: session until then, transaction when neither flag is set (see pool_mode).
        self.session_mode = True
        self.statement_mode = False
        #: Its session state keeps its server (see session).
        self.pinned = False
        #: The client sent messages after its last Sync or Query (an extended batch goes on):
        #: the ReadyForQuery before them must not end the link, or another client would get
        #: a server in the middle of this one's batch (its Bind, its portal).
        self.open_batch = False
        #: It parsed the unnamed statement and bound no portal to it yet (relay.py).
        self.unnamed_unbound = False
        #: Its LISTEN state (listen) needs a look at a ReadyForQuery: replies owed, channels
        #: not confirmed yet, notifications queued (one check on the hot path).
        self.listening = False
        #: The client's socket buffer is full (pause_writing): notifications wait.
        self.write_paused = False
        #: Its session state is tracked (transaction and statement mode, see session); its
        #: prepared statements are followed (see statements).
        self.tracked = False
        self.follows_statements = False
        #: Logged in to its pool: counted in the pool's logged_in (client_joined) until it
        #: leaves. (A count, where a pool's container of its clients took a dict entry per
        #: client: the runtime's index, Runtime.clients, holds every client already.)
        self.joined = False
        self.runtime = runtime
        self.id = next(runtime.ids)
        self.state = ClientState.STARTUP
        self.transport: asyncio.Transport | None = None
        #: How write sends: straight to the socket, or through the transport (net/sending.py).
        self.send_state = SEND_NEVER
        #: Where it connected from: the host (interned: many clients come from a few
        #: hosts) and the port; "unix" and 0 over a unix socket. The addr property joins
        #: them when asked (a log line, SHOW CLIENTS), not a string kept per client.
        self.peer_host = ""
        self.peer_port = 0
        self.user = ""
        self.database = ""
        #: The relay's, lent at the welcome (ClientRelay.start; see MessageScanner.kept).
        self.scanner = _SCANNER_UNTIL_WELCOME
        self.pool: Pool[ServerConnection] | None = None
        self.server: ServerConnection | None = None
        self.expected = 0
        #: Bytes waiting for a server; in prepared-statement mode (parts, chunk).
        self.pending = NO_PENDING
        self.pending_size = 0
        #: Tracked parameters (client_encoding, TimeZone, ...) as this client set them.
        self.params = NO_PARAMS  # from the welcome on: its values' shared dict (never written)
        #: The BackendKeyData key it gets at accept (Runtime.new_key; NO_KEY: none yet).
        self.cancel_key = NO_KEY
        self.db: DatabaseEntry | None = None
        #: Transaction mode: this client's named prepared statements, and the framer that
        #: finds its Parse/Bind/Describe/Close (None: passed through untouched), both made
        #: at its first Parse/Bind/Describe/Close or SQL PREPARE (relay.py).
        self.statements: ClientStatements | None = None
        self.framer: ClientFramer | None = None
        #: Transaction and statement mode: its session tracking (tracking.py), made when
        #: first needed (_tracking_made): None while tracked but no text yet may have
        #: changed its state, as most clients' never does, or when not tracked. Whether it
        #: keeps its server is `pinned`. (The effects of its named prepared statements,
        #: counted at each Bind, are its framer's.)
        self.tracking: SessionTracking | None = None
        #: read_write_split (transaction and statement mode): where its transactions go.
        self.route: ClientRoute[Pool[ServerConnection]] | None = None
        #: Its LISTEN state (listening.py), made when first needed (_listen_made).
        self.listen: ClientListen | None = None
        #: When this client's query and transaction began (monotonic, 0: none under way).
        self.query_start = 0.0
        self.xact_start = 0.0
        self.last_request = 0.0
        #: Monotonic: connected (client_login_timeout; connect_time derives from it), last
        #: query ended (client_idle_timeout, idle_transaction_timeout).
        self.created_at = self.idle_since = monotonic()
        #: What few clients use (extras.py): made at first use (_extras_made).
        self.extras: ClientExtras | None = None
        #: A message too long to hold, on its way in pieces (large.py).
        self.large: ClientLargeMessage | None = None

    def __repr__(self) -> str:
        # PgBouncer's layout, which log readers parse: "C-id: database/user@host:port"
        return f"C-{self.id}: {self.database or '(nodb)'}/{self.user or '(nouser)'}@{self.addr}"

    def _peer_uid(self) -> int | None:
        """The OS user id of a unix-socket peer; None over TCP."""
        credentials = peer_credentials(self.transport)
        return None if credentials is None else credentials[1]

    def _extras_made(self) -> ClientExtras:
        """Its ClientExtras, made now if it had none."""
        extras = self.extras
        if extras is None:
            extras = self.extras = ClientExtras()
        return extras

    # The fields of ClientExtras, read as the client's own (the defaults while it has none).

    def notification_pid(self) -> int:
        return self.cancel_key[0] if self.session_mode else 0

    def schema_change_sent(self) -> None:
        """The client sent a text that may change the schema (DDL): every shared prepared
        statement is prepared afresh (session.statements.StatementCache.schema_changed), now
        and again once its transaction ends."""
        self.runtime.statement_cache.schema_changed()
        self._extras_made().schema_pending = True

    def schema_change_ended(self) -> None:
        """The transaction of the client's DDL ended (ReadyForQuery with status I, or the
        client left): statements prepared while it ran saw the schema before it."""
        extras = self.extras
        if extras is not None and extras.schema_pending:
            extras.schema_pending = False
            self.runtime.statement_cache.schema_changed()

    @property
    def admin(self) -> AdminSession | None:
        """The admin console's session, once logged in to it."""
        extras = self.extras
        return None if extras is None else extras.admin

    @admin.setter
    def admin(self, session: AdminSession | None) -> None:
        self._extras_made().admin = session

    @property
    def replication(self) -> str:
        """A replication connection: "physical" or "logical" ("": none, the usual)."""
        extras = self.extras
        return "" if extras is None else extras.replication

    @replication.setter
    def replication(self, kind: str) -> None:
        self._extras_made().replication = kind

    @property
    def close_reason(self) -> str:
        """Why pgtarn closed the connection (for the log line), "" while it did not."""
        extras = self.extras
        return "" if extras is None else extras.close_reason

    @close_reason.setter
    def close_reason(self, reason: str) -> None:
        self._extras_made().close_reason = reason

    @property
    def last_server(self) -> ServerConnection | None:
        """A client with session settings: the server it last left them on (preferred)."""
        extras = self.extras
        return None if extras is None else extras.last_server

    @last_server.setter
    def last_server(self, server: ServerConnection | None) -> None:
        self._extras_made().last_server = server

    # Made by ClientConnection, which has all that the parts ask of their connection
    # (interfaces.py); the link and the relay, which see a ClientTransport, call them: its
    # LISTEN state, its session tracking, the end of a session's pending batch (False: the
    # client was closed), its prepared statements followed from now on (or no longer: its
    # server's own), and the part of a message too long to hold (start: its first bytes,
    # already of them sent).

    def _listen_made(self) -> ClientListen:
        raise NotImplementedError

    def _tracking_made(self) -> SessionTracking:
        raise NotImplementedError

    def _session_ready(self, status: bytes) -> bool:
        raise NotImplementedError

    def _start_statements(self) -> None:
        raise NotImplementedError

    def _statements_ceded(self) -> None:
        raise NotImplementedError

    def _large_made(self, start: bytes, already: int) -> ClientLargeMessage:
        raise NotImplementedError

    @property
    def session(self) -> SessionTracker | None:
        """Its session state (tracking.py; None: the state every client starts with)."""
        tracking = self.tracking
        return None if tracking is None else tracking.session

    @property
    def subscribed(self) -> frozenset[str]:
        """The channels the pool's board has for it."""
        listen = self.listen
        return NO_CHANNELS if listen is None else listen.subscribed

    # Derived when asked (SHOW CLIENTS, a log line, a handover), not kept per client: a few
    # thousand idle clients each hold a field less for each.

    @property
    def tls(self) -> TlsTransport | None:
        """The TLS layer once the client asked for TLS (it is then the transport)."""
        transport = self.transport
        return transport if isinstance(transport, TlsTransport) else None

    @property
    def pool_mode(self) -> str:
        """Its pool's mode as it logged in ("session" before it did)."""
        if self.session_mode:
            return "session"
        return "statement" if self.statement_mode else "transaction"

    def set_pool_mode(self, mode: str) -> None:
        self.session_mode = mode == "session"
        self.statement_mode = mode == "statement"

    @property
    def connect_time(self) -> float:
        """Wall clock of the connect, for display: from the monotonic created_at."""
        return time.time() - (monotonic() - self.created_at)

    @property
    def peer_pid(self) -> int:
        """The process id of a unix-socket peer (SHOW CLIENTS); 0 over TCP or once closed."""
        credentials = peer_credentials(self.transport)
        return 0 if credentials is None else credentials[0]

    def peer_os_user(self) -> str | None:
        uid = self._peer_uid()
        return os_user_name(uid) if uid is not None else None

    def same_os_user(self) -> bool:
        """A unix-socket peer running as the same OS user as this process."""
        return self._peer_uid() == os.getuid()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.send_state = send_state_of(transport)
        # SO_KEEPALIVE came with the socket from its listener (keepalive_listeners)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.peer_host = intern(str(peer[0]))
            self.peer_port = int(peer[1])
            options = self.runtime.tcp_options
            if options:  # tcp_keepidle and the like: set on the connection, as PgBouncer
                tune(transport, False, options)
        else:
            self.peer_host = "unix"

    def wrap_tls(
        self,
        context: ssl.SSLContext,
        received: bytes,
        binding: bytes | None,
        on_ready: Callable[[], None],
        on_failed: Callable[[Exception], None],
    ) -> TlsTransport:
        """The client asked for TLS: a TlsTransport over its transport is its transport from
        now on (received: bytes of the handshake read already)."""
        raw = self.transport
        assert raw is not None
        tls = TlsTransport(
            raw,
            context,
            self,
            server_side=True,
            received=received,
            on_ready=on_ready,
            on_failed=on_failed,
            binding=binding,
        )
        self.transport = tls
        self.send_state = SEND_NEVER  # (writes go through the TLS layer now)
        return tls

    @property
    def addr(self) -> str:
        """ "host:port" it connected from; "unix" over a unix socket ("" before it did)."""
        return f"{self.peer_host}:{self.peer_port}" if self.peer_port else self.peer_host

    @property
    def local_addr(self) -> str:
        """The address the client connected to ("host:port"; "" over a unix socket or once
        closed): read from the socket when SHOW CLIENTS asks, not at every login."""
        if self.peer_port and self.transport is not None:
            sockname = self.transport.get_extra_info("sockname")
            if isinstance(sockname, tuple):
                return address(sockname)
        return ""

    def log_closing(self, reason: str) -> None:
        """The "closing because" line (log_disconnections), once per client."""
        extras = self._extras_made()
        if not extras.close_logged:
            extras.close_logged = True
            if self.runtime.config.log_disconnections:
                log.info(
                    "%r closing because: %s (age=%ds)", self, reason, monotonic() - self.created_at
                )

    def close(
        self, error: PgtarnError | None = None, response: bytes | None = None, reason: str = ""
    ) -> None:
        """Send error (if any; response: its ErrorResponse when already built) and close; the
        server side is cleaned in connection_lost. reason: why, when no error is sent."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self.send_state = SEND_NEVER  # (what is written from here on goes through the transport)
        if error is not None or reason:
            self.close_reason = error.message if error is not None else reason
        if self.close_reason:  # logged first: a log reader never sees the error before it
            self.log_closing(self.close_reason)
        if error is not None:
            if self.runtime.config.log_pooler_errors:
                log.warning("%r pooler error: %s", self, error.message)
            if response is None:
                response = build.error_response(error.sqlstate, error.message, error.severity)
            transport.write(response)
        if transport.get_write_buffer_size():
            # It does not read (or not fast enough): close() would wait for the buffer to
            # drain, maybe for ever, and with it the cleanup that frees its server.
            transport.abort()
        else:
            transport.close()
        self.leave_containers()

    def close_flushing(self, error: PgtarnError, grace: float) -> None:
        """Send error after what the client has not read yet and close once it is read, or
        after grace seconds (a client that reads nothing cannot keep the socket)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self.send_state = SEND_NEVER
        self.close_reason = error.message
        self.log_closing(error.message)
        transport.write(build.error_response(error.sqlstate, error.message, error.severity))
        transport.close()
        asyncio.get_running_loop().call_later(grace, transport.abort)
        self.leave_containers()

    def leave_containers(self) -> None:
        """Closing: no longer counted anywhere, though the socket may still flush an error.

        Out of max_client_conn's count (in a connect storm, clients refused but still flushing
        their error would otherwise get more clients refused) and out of the runtime's and the
        pool's containers, so SHOW counts it no more and no server is handed to it; the rest
        of the cleanup waits for connection_lost."""
        runtime = self.runtime
        runtime.remove_client(self.cancel_key, cast("ClientView", self))  # (the assembled one is)
        runtime.logins.discard(self)
        runtime.admin_clients.discard(self)
        self._leave_pool()
        self._stop_listening()

    def _stop_listening(self) -> None:
        """Out of its pool's board, what it did not get dropped (listening.py)."""
        listen = self.listen
        if listen is not None:
            listen.stop()

    def join_pool(self, pool: Pool[ServerConnection]) -> None:
        """Logged in to pool: counted in it (logged_in) until it leaves."""
        pool.client_joined(self)
        self.joined = True

    def _leave_pool(self) -> None:
        """Out of its pool's containers, and its count if it joined (once)."""
        pool = self.pool
        if pool is not None:
            pool.client_left(self, self.joined)
            self.joined = False

    def write(self, data: bytes) -> None:
        transport = self.transport
        if transport is not None:
            state = self.send_state
            if state == SEND_NEVER and transport.is_closing():
                return  # closed (close: its error is the last the client reads)
            self.send_state = send(state, transport, data)
            pool = self.pool
            if pool is not None:
                pool.stats.sent += len(data)

    # --- flow control: a slow reader stops its peer from reading ------------------------------

    def pause_writing(self) -> None:
        self.write_paused = True
        server = self.server
        if server is not None:
            server.pause_reading()
        elif self.admin is not None:
            self.admin.writable(False)

    def resume_writing(self) -> None:
        self.write_paused = False
        server = self.server
        if server is not None:
            server.resume_reading()
        elif self.admin is not None:
            self.admin.writable(True)
        listen = self.listen
        if listen is not None:
            listen.release_notifications()

    def pause_reading(self) -> None:
        """The linked server's PostgreSQL reads too slowly: stop reading this client."""
        transport = self.transport
        if transport is not None:
            transport.pause_reading()

    def resume_reading(self) -> None:
        transport = self.transport
        if transport is not None:
            transport.resume_reading()
