"""ClientConnection: log a client in, get it a server from its pool, relay its bytes.

Theory of operation. A client goes STARTUP -> AUTH -> (WELCOME) -> READY. In READY every
received chunk is scanned only for Query, Sync and Terminate: each Query or Sync means one
ReadyForQuery to come. The first message that finds no server linked asks the pool for one;
until it comes the bytes wait in ``pending``. The server calls ``ready_for_query`` on each
ReadyForQuery; when none is outstanding and the mode allows it (transaction: status idle;
statement: always) the link ends and the server goes back to its pool. Before a server is
linked, the client's tracked parameters that differ on that server are SET in front of the
client's own bytes, and their replies are swallowed, so no round trip is added.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import secrets
import socket
import ssl
import struct
import time
from bisect import bisect_left
from time import monotonic
from typing import TYPE_CHECKING, cast

from . import __version__
from .access import Connection, auth_method, os_user_name, peer_address
from .admin.console import AdminSession
from .errors import AuthFailed, PgtarnError, ProtocolViolation
from .pool.pool import Pool
from .pool.stats import BUCKETS, PoolStats
from .proto import build
from .proto.client_side import ClientAuth
from .proto.framing import MessageScanner, StartupReader
from .proto.messages import (
    CANCEL_REQUEST,
    GSSENC_REQUEST,
    SSL_REQUEST,
    StartupPacket,
    parse_startup,
)
from .session.framer import SYNC_MARK, ClientFramer, Part
from .session.prepared import FORGETS_ALL, ClientStatements
from .session.sqlnames import has_statement_words, may_name_statements
from .tls import ALPN, TlsTransport, certificate_name, describe, has_certificate

if TYPE_CHECKING:
    from .authquery import SecretLookup
    from .config import DatabaseEntry
    from .runtime import Runtime
    from .server import ServerConnection

log = logging.getLogger("pgtarn.client")

AUTH_TYPES = frozenset(range(256))
# In READY only these client messages matter: Query, Sync, Terminate.
RELAY_TYPES = frozenset(b"QSX")
STATEMENT_RELAY_TYPES = frozenset(b"QSXP")
# Transaction mode before a client's first Parse/Bind/Describe/Close: those are noticed too.
WATCH_STATEMENTS_TYPES = frozenset(b"QSXPBDC")
STATEMENT_MESSAGES = frozenset(b"PBDC")
STATEMENT_MESSAGES_OR_QUERY = frozenset(b"PBDCQ")
TRACKED_DEFAULT = (
    "client_encoding",
    "DateStyle",
    "TimeZone",
    "standard_conforming_strings",
    "application_name",
)
PENDING_PAUSE = 256 * 1024
#: Methods that need the user's secret, which auth_query may find when auth_file has none.
LOOKED_UP = frozenset({"md5", "scram-sha-256", "plain", "trust", "any"})
RFQ_IDLE = build.ready_for_query(b"I")
TRANSACTION_REFUSED = build.error_response(
    "0A000",
    "transaction blocks not allowed in statement pooling mode",
    hint="use pool_mode=transaction or session for this database or user",
)
_TRANSACTION_WORDS = (b"begin", b"start")
WAIT_NOTICE = build.error_response(
    "00000", "all server connections of this pool are in use; the query is queued",
    "NOTICE", hint="the pool size (pool_size, max_db_connections) limits the servers",
    notice=True,
)
ADMIN_DATABASES = ("pgbouncer", "pgtarn")
#: Admin console logins allowed past max_client_conn, so an operator can get in when full.
ADMIN_RESERVE = 10
ADMIN_WELCOME = {
    "server_version": f"{__version__}/pgtarn",
    "client_encoding": "UTF8",
    "server_encoding": "UTF8",
    "DateStyle": "ISO",
    "TimeZone": "GMT",
    "standard_conforming_strings": "on",
    "integer_datetimes": "on",
    "is_superuser": "on",
}
_PEERCRED = struct.Struct("3i")
#: What a prepared-statement client sent: (parts, the chunk when the parts are all of it,
#: whether it makes the server forget its statements); parts None: one whole Query.
PendingParts = tuple[list[Part] | None, bytes | None, bool]


class State(enum.Enum):
    STARTUP = "startup"
    AUTH = "auth"
    WELCOME = "welcome"
    READY = "ready"
    ADMIN = "admin"
    CLOSED = "closed"


class ClientConnection(asyncio.Protocol):
    """One application connection."""

    # Thousands of these may sit idle: no per-instance dict.
    __slots__ = (
        "addr",
        "admin",
        "admin_role",
        "auth",
        "cancel_key",
        "cancelled_at",
        "close_reason",
        "connect_time",
        "created_at",
        "database",
        "db",
        "discard_scanner",
        "expected",
        "framer",
        "id",
        "idle_since",
        "last_request",
        "local_addr",
        "negotiate_minor",
        "params",
        "peer_pid",
        "pending",
        "pending_size",
        "pool",
        "pool_mode",
        "query_start",
        "runtime",
        "scanner",
        "secret_lookup",
        "server",
        "startup_params",
        "startup_reader",
        "state",
        "statement_mode",
        "statements",
        "stats",
        "tls",
        "transport",
        "user",
        "wait_notified",
        "waiting",
        "xact_start",
    )

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.id = next(runtime.ids)
        self.state = State.STARTUP
        self.transport: asyncio.Transport | None = None
        #: The TLS layer once the client asked for TLS (it is then self.transport too).
        self.tls: TlsTransport | None = None
        self.addr = ""
        self.user = ""
        self.database = ""
        self.startup_reader = StartupReader()
        self.scanner = MessageScanner(AUTH_TYPES, 10000)
        self.auth: ClientAuth | None = None
        #: auth_query: where this client's secret came from (None: auth_file).
        self.secret_lookup: SecretLookup | None = None
        self.pool: Pool[ServerConnection] | None = None
        self.pool_mode = "session"
        self.server: ServerConnection | None = None
        self.waiting = False
        self.wait_notified = False
        self.expected = 0
        #: Bytes waiting for a server; in prepared-statement mode (parts, chunk, forgets_all).
        self.pending: list[bytes | PendingParts] = []
        self.pending_size = 0
        #: Tracked parameters (client_encoding, TimeZone, ...) as this client set them.
        self.params: dict[str, str] = {}
        self.startup_params: dict[str, str] = {}
        self.cancel_key = (0, 0)
        self.negotiate_minor: tuple[int, list[str]] | None = None
        self.db: DatabaseEntry | None = None
        self.statement_mode = False
        #: Statement mode: set while skipping a refused extended batch up to its Sync.
        self.discard_scanner: MessageScanner | None = None
        #: Transaction mode: this client's named prepared statements, and the framer that
        #: finds its Parse/Bind/Describe/Close (None: passed through untouched).
        self.statements: ClientStatements | None = None
        self.framer: ClientFramer | None = None
        #: The pool's counters once logged in; when this client's query and transaction
        #: began (monotonic, 0: none under way); wall clock of the connect, for display.
        self.stats: PoolStats | None = None
        self.query_start = 0.0
        self.xact_start = 0.0
        self.last_request = 0.0
        #: Monotonic: connected (client_login_timeout), last query ended (client_idle_timeout,
        #: idle_transaction_timeout), query_timeout's cancel sent (0: none).
        self.created_at = self.idle_since = monotonic()
        self.cancelled_at = 0.0
        #: Why pgtarn closed the connection (for the log line), "" while it did not.
        self.close_reason = ""
        self.connect_time = time.time()
        self.local_addr = ""
        self.peer_pid = 0
        #: The admin console: "admin" or "stats" once chosen at login, and the session.
        self.admin_role: str | None = None
        self.admin: AdminSession | None = None

    def __repr__(self) -> str:
        return f"C-{self.id}({self.user or '?'}@{self.addr}/{self.database or '?'})"

    # --- connection lifecycle -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        transport = self.transport
        peer = transport.get_extra_info("peername")
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.runtime.config.tcp_keepalive:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            self.addr = f"{peer[0]}:{peer[1]}"
            local = sock.getsockname()
            self.local_addr = f"{local[0]}:{local[1]}"
        else:
            self.addr = "unix"
        self.runtime.clients.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.state is State.CLOSED and self not in self.runtime.clients:
            return
        previous = self.state
        self.state = State.CLOSED
        self.runtime.clients.discard(self)
        self.runtime.cancel_keys.pop(self.cancel_key, None)
        if self.admin is not None:
            self.admin.closed()
        if self.statements is not None:
            self.statements.clear()  # the shared cache keeps only what live clients name
        if self.pool is not None:
            if self.waiting:
                self.pool.cancel_wait(self)
                self.waiting = False
            self.pool.cancel_welcome(self)
        self._drop_server()
        if (self.pool is not None or self.admin is not None) \
                and self.runtime.config.log_disconnections:
            if self.close_reason:
                reason = self.close_reason
            elif previous is State.CLOSED:  # it sent Terminate
                reason = "client close request"
            elif exc is None:
                reason = "client closed the connection"
            else:
                reason = f"client connection error: {exc}"
            log.info("%r: closing because: %s (age=%ds)", self, reason,
                     monotonic() - self.created_at)
        self.runtime.on_client_gone()

    def close(self, error: PgtarnError | None = None) -> None:
        """Send error (if any) and close; the server side is cleaned in connection_lost."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if error is not None:
            self.close_reason = error.message
            transport.write(build.error_response(error.sqlstate, error.message, error.severity))
            if self.runtime.config.log_pooler_errors:
                log.warning("%r: pooler error: %s", self, error.message)
        if transport.get_write_buffer_size():
            # It does not read (or not fast enough): close() would wait for the buffer to
            # drain, maybe for ever, and with it the cleanup that frees its server.
            transport.abort()
        else:
            transport.close()
        # No longer counted against max_client_conn: in a connect storm, clients refused but
        # still flushing their error would otherwise get more clients refused.
        self.runtime.clients.discard(self)

    def write(self, data: bytes) -> None:
        transport = self.transport
        if transport is not None:
            transport.write(data)
            stats = self.stats
            if stats is not None:
                stats.sent += len(data)

    # --- flow control: a slow reader stops its peer from reading ------------------------------

    def pause_writing(self) -> None:
        server = self.server
        if server is not None and server.transport is not None:
            server.transport.pause_reading()
        elif self.admin is not None:
            self.admin.writable(False)

    def resume_writing(self) -> None:
        server = self.server
        if server is not None and server.transport is not None:
            server.transport.resume_reading()
        elif self.admin is not None:
            self.admin.writable(True)

    # --- bytes from the client -----------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        try:
            if self.state is State.READY:
                stats = self.stats
                assert stats is not None
                stats.received += len(data)
                if not self.query_start:
                    self.query_start = self.last_request = monotonic()
                if self.framer is None:
                    self._relay(data)
                else:
                    self._relay_prepared(data)
            elif self.state is State.STARTUP:
                self._startup(data)
            elif self.state is State.AUTH:
                self._auth_data(data)
            elif self.state is State.ADMIN:
                assert self.admin is not None
                self.admin.feed(data)
            elif self.state is State.WELCOME:
                raise ProtocolViolation("message received before ReadyForQuery")
        except PgtarnError as error:
            self.close(error)

    def _relay(self, data: bytes) -> None:
        if self.statement_mode:
            data = self._refuse_transaction_blocks(data)
            if not data and not self.expected and self.server is None:
                # answered here: no query under way, and the client was not idle
                self.query_start = 0.0
                self.idle_since = monotonic()
        scanner = self.scanner
        if self.statements is not None:  # statement tracking is on, not yet needed
            at_boundary = scanner.at_boundary
            events = scanner.feed(data)
            for msg_type, _body, _end in events:
                if msg_type in STATEMENT_MESSAGES or (
                        msg_type == 0x51 and (
                            may_name_statements(data, 5) if len(events) == 1 and data[0] == 0x51
                            else has_statement_words(data))):
                    # Nothing of this chunk has gone yet: from here on, the framer.
                    assert at_boundary
                    self._start_statements()
                    self._relay_prepared(data)
                    return
            held = scanner.held
            if held and data[len(data) - held] in STATEMENT_MESSAGES_OR_QUERY:
                # The chunk ends inside a Parse/Bind/..., or a Query that may name SQL-level
                # statements: keep that start for the framer.
                self._relay_events(data[: len(data) - held], events)
                if self.state is State.READY:
                    self._start_statements()
                    self._relay_prepared(data[len(data) - held :])
                return
            self._relay_events(data, events)
            return
        self._relay_events(data, scanner.feed(data))

    def _start_statements(self) -> None:
        """The client uses the extended protocol: track its statements from now on.

        Replies still owed for what went before are ReadyForQuery only (no statement
        messages were sent), so they become sync markers ahead of anything tracked.
        """
        self.framer = ClientFramer(self.runtime.config.max_packet_size)
        outstanding = self.expected
        server = self.server
        if server is not None:
            statements = server.prepared_statements()
            for _ in range(outstanding):
                statements.sync_sent()
        elif self.pending:
            raw = b"".join(item for item in self.pending if isinstance(item, bytes))
            parts: list[Part] = [raw, *([SYNC_MARK] * outstanding)]
            self.pending = [(parts, None, False)]

    def _relay_events(self, data: bytes, events: list[tuple[int, bytes, int]]) -> None:
        for msg_type, _body, end in events:
            if msg_type == 0x58:  # Terminate: forward what came before it, then leave
                if end > 5:
                    self._to_server(data[: end - 5])
                self.state = State.CLOSED
                self.connection_lost(None)
                if self.transport is not None:
                    self.transport.close()
                return
            if msg_type in (0x51, 0x53):  # Query or Sync: one ReadyForQuery to come
                self.expected += 1
        if data:
            self._to_server(data)

    def _relay_prepared(self, data: bytes) -> None:
        """Transaction mode with prepared statements: statements are rewritten per server."""
        framer = self.framer
        assert framer is not None and self.statements is not None
        if (data[0] == 0x51 and framer.idle and len(data) > 5
                and int.from_bytes(data[1:5], "big") + 1 == len(data)
                and not may_name_statements(data, 5)):
            # The common case: one whole simple Query, passed on as it is.
            self.expected += 1
            forgets = _may_forget_all(data) and FORGETS_ALL.search(data) is not None
            if forgets:
                self.statements.clear()
            self._send_item((None, data, forgets), len(data))
            return
        parts, syncs = framer.feed(data)
        self.expected += syncs
        forgets = bool(syncs and _may_forget_all(data) and FORGETS_ALL.search(data))
        if forgets:
            # DISCARD ALL / DEALLOCATE ALL: the client's names go now, the server's
            # statements when the parts are encoded for it.
            self.statements.clear()
        if parts:
            self._send_item((parts, data if framer.whole else None, forgets), len(data))
        if framer.terminated:
            self.state = State.CLOSED
            self.connection_lost(None)
            if self.transport is not None:
                self.transport.close()

    def _encode(self, server: ServerConnection, item: bytes | PendingParts) -> bytes:
        """Bytes for server from what the client sent (rewritten for its statements)."""
        if isinstance(item, bytes):
            return item
        assert self.statements is not None
        statements = server.prepared_statements()
        parts, chunk, forgets = item
        if forgets:
            statements.clear()  # the server forgets them when it runs the query
        if parts is None:  # one whole Query
            assert chunk is not None
            statements.sync_sent()
            return chunk
        data = statements.send(self.statements, parts, chunk)
        server._start_hidden()  # a statement prepared ahead of a simple query
        return data

    def _refuse_transaction_blocks(self, data: bytes) -> bytes:
        """Statement mode: answer BEGIN / START TRANSACTION here, before any server sees it.

        Only when nothing else is in flight, so the error cannot overtake earlier replies;
        anything that still opens a transaction is caught at ReadyForQuery.
        """
        if self.discard_scanner is not None:
            syncs = self.discard_scanner.feed(data)
            if not syncs:
                return b""
            self.discard_scanner = None
            self.write(TRANSACTION_REFUSED + RFQ_IDLE)
            data = data[syncs[0][2] :]
        if self.expected or self.server is not None or not data:
            return data
        if not self.scanner.at_boundary:
            return data
        msg_type = data[0]
        if msg_type not in (0x51, 0x50) or len(data) < 5:
            return data
        if msg_type == 0x51:
            text = data[5:69]
        else:  # Parse: statement name, then the query text
            name_end = data.find(b"\x00", 5)
            if name_end < 0:
                return data  # name not complete yet: left to the ReadyForQuery check
            text = data[name_end + 1 : name_end + 65]
        if not _opens_transaction(text):
            return data
        end = 1 + int.from_bytes(data[1:5], "big")
        if end > len(data):
            return data
        if msg_type == 0x51:
            self.write(TRANSACTION_REFUSED + RFQ_IDLE)
            return data[end:]
        # extended protocol: the error ends the batch; skip to its Sync
        self.discard_scanner = MessageScanner(frozenset(b"S"), self.runtime.config.max_packet_size)
        return self._refuse_transaction_blocks(data[end:])

    def _to_server(self, data: bytes) -> None:
        server = self._server_now()
        if server is not None:
            server.write(data)
        else:
            self._hold(data, len(data))

    def _send_item(self, item: PendingParts, size: int) -> None:
        """Prepared-statement mode: encode for the linked server, or keep until one comes."""
        server = self._server_now()
        if server is not None:
            server.write(self._encode(server, item))
        else:
            self._hold(item, size)

    def _server_now(self) -> ServerConnection | None:
        """The linked server, or an idle one linked now; None (and queued) otherwise."""
        server = self.server
        if server is None and not self.waiting:
            assert self.pool is not None
            self.waiting = True
            server = self.pool.acquire(self)
            if server is not None:  # the common case: an idle server, no queue
                self.waiting = False
                self._link(server)
        return server

    def _hold(self, item: bytes | PendingParts, size: int) -> None:
        """Keep what the client sent until server_assigned; pause a client that sends a lot."""
        self.pending.append(item)
        self.pending_size += size
        if self.pending_size > PENDING_PAUSE and self.transport is not None:
            self.transport.pause_reading()

    # --- startup and authentication --------------------------------------------------------------

    def _startup(self, data: bytes) -> None:
        if data[:1] == b"\x16" and self.tls is None and not self.startup_reader.pending:
            # A TLS record where a startup packet's length begins (no startup packet is that
            # long): direct TLS, as PostgreSQL 17's sslnegotiation=direct
            self._direct_tls(data)
            return
        body, rest = self.startup_reader.feed(data)
        if body is None:
            return
        code = int.from_bytes(body[:4], "big")
        if code >> 16 != 3 and code not in (SSL_REQUEST, GSSENC_REQUEST, CANCEL_REQUEST):
            # PostgreSQL's answer to a major version it does not speak, checked before the
            # rest of the packet as PostgreSQL does (a 2.0 packet has no parameter list)
            raise PgtarnError(
                f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF}: "
                "server supports 3.0 to 3.0", sqlstate="0A000", severity="FATAL")
        packet = parse_startup(body)
        if packet.code in (SSL_REQUEST, GSSENC_REQUEST):
            context = self.runtime.client_tls
            if (packet.code == SSL_REQUEST and context is not None and self.tls is None
                    and self.addr != "unix"):
                self.write(b"S")
                self._start_tls(context, rest, direct=False)
                return
            self.write(b"N")
            if rest:
                self._startup(rest)
            return
        if packet.code == CANCEL_REQUEST:
            self._cancel_request(packet)
            return
        if packet.minor != 0:
            unknown = [name for name in packet.params if name.startswith("_pq_.")]
            self.negotiate_minor = (0, unknown)
        self._login(packet)
        if rest and self.state is State.AUTH:
            self._auth_data(rest)

    def _direct_tls(self, data: bytes) -> None:
        context = self.runtime.client_tls
        if context is None or self.addr == "unix":
            # No TLS here, and nothing a TLS client could read as an error: just close.
            self.close_reason = "direct TLS connection, but client TLS is disabled"
            if self.runtime.config.log_connections:
                log.info("%r: closing because: %s", self, self.close_reason)
            assert self.transport is not None
            self.transport.close()
            return
        self._start_tls(context, data, direct=True)

    def _start_tls(self, context: ssl.SSLContext, received: bytes, direct: bool) -> None:
        """Go on over TLS; received: bytes already read that belong to the handshake."""
        raw = self.transport
        assert raw is not None
        tls = TlsTransport(raw, context, self, server_side=True, received=received,
                           on_ready=lambda: self._tls_ready(direct), on_failed=self._tls_failed,
                           binding=self.runtime.client_tls_binding)
        self.transport = self.tls = tls
        tls.start()

    def _tls_ready(self, direct: bool) -> None:
        assert self.tls is not None
        if direct and self.tls.ssl_object.selected_alpn_protocol() != ALPN:
            # as PostgreSQL 17: direct TLS only with ALPN, so it cannot be mistaken for
            # another protocol's TLS
            self.close(PgtarnError(
                "received direct SSL connection request without ALPN protocol negotiation "
                "extension", sqlstate="08P01"))

    def _tls_failed(self, exc: Exception) -> None:
        self.close_reason = f"TLS failed: {exc}"
        if self.runtime.config.log_connections:
            log.info("%r: TLS failed: %s", self, exc)

    def _login(self, packet: StartupPacket) -> None:
        config = self.runtime.config
        database = packet.params.get("database") or packet.params.get("user", "")
        admin = database in ADMIN_DATABASES and database not in config.databases
        limit = config.max_client_conn + (ADMIN_RESERVE if admin else 0)
        local_admin = admin and packet.params.get("user") == "pgbouncer" \
            and self._same_os_user()
        if len(self.runtime.clients) > limit and not local_admin:
            raise PgtarnError(
                "no more connections allowed (max_client_conn)", sqlstate="53300"
            )
        params = {k: v for k, v in packet.params.items() if not k.startswith("_pq_.")}
        user = params.pop("user", "")
        if not user:
            raise PgtarnError("no user name specified in startup packet", sqlstate="28000")
        self.user = user
        self.database = params.pop("database", "") or user
        tracked = {name.lower(): name for name in self.tracked_names()}
        ignored = {name.lower() for name in config.ignore_startup_parameters}
        for name, value in params.items():
            canonical = tracked.get(name.lower())
            if canonical is not None:
                self.startup_params[canonical] = value
            elif name.lower() not in ignored:
                raise PgtarnError(f"unsupported startup parameter: {name}", sqlstate="08P01")
        if config.log_connections:
            log.info("%r: login attempt: db=%s user=%s tls=%s", self, self.database, user,
                     describe(self.tls) or "no")

        if admin:
            self.admin_role = self._admin_role(user)
            if local_admin:
                # As PgBouncer: the OS user running the pooler, over the unix socket.
                self.admin_role = "admin"
                self.write(build.AUTH_OK)
                self._admin_ready()
                return
        else:
            db = config.find_database(self.database)
            if db is None:
                raise PgtarnError(f'no such database: "{self.database}"', sqlstate="3D000")
            self.db = db
        connection = Connection(
            local=self.addr == "unix", tls=self.tls is not None,
            address=peer_address(self.addr), certificate=has_certificate(self.tls),
            certificate_name=certificate_name(self.tls),
            os_user=self._peer_os_user)
        try:
            auth_type = auth_method(config, self.runtime.hba, self.runtime.ident, connection,
                                    self.database, user)
        except PgtarnError as refused:
            log.info("%r: login refused: %s", self, refused.message)
            raise
        secret = self.runtime.userlist.get(user)
        if secret is None and self.db is not None and auth_type in LOOKED_UP:
            lookup = self.runtime.secret_lookup(self.db)
            if lookup is not None:
                # auth_query: the challenge (its salt) waits for the secret
                self.state = State.AUTH
                self.secret_lookup = lookup
                self.runtime.spawn(self._look_up(lookup, auth_type, user))
                return
        self._start_auth(auth_type, user, secret)

    async def _look_up(self, lookup: SecretLookup, auth_type: str, user: str) -> None:
        try:
            secret = await lookup.secret(user)
            if self.state is State.AUTH and self.auth is None:  # still there, still waiting
                if secret is not None and self.db is not None:
                    self.runtime.found_secret(self.db, user, secret)
                self._start_auth(auth_type, user, secret)
        except PgtarnError as error:
            self.close(error)

    def _start_auth(self, auth_type: str, user: str, secret: str | None) -> None:
        """Send the first authentication message (a challenge, or AuthenticationOk)."""
        binding = self.tls.binding if self.tls is not None else None
        self.auth = ClientAuth(auth_type, user, secret, self.runtime.config.scram_iterations,
                               binding)
        self.state = State.AUTH
        first = self.auth.start()
        self.write(first)
        if self.auth.done:
            self._authenticated()

    def _auth_data(self, data: bytes) -> None:
        auth = self.auth
        for msg_type, body, _end in self.scanner.feed(data):
            if msg_type == 0x58:
                self.close()
                return
            if auth is None:  # auth_query still looking: nothing was asked yet
                raise ProtocolViolation("message received before an authentication request")
            if msg_type != 0x70:
                raise ProtocolViolation(
                    f"expected a password message, got {chr(msg_type)!r}"
                )
            try:
                reply = auth.feed(body)
            except AuthFailed:
                if self.secret_lookup is not None:
                    self.secret_lookup.forget(self.user)  # maybe changed: ask again next time
                raise
            self.write(reply)
            if auth.done:
                self._authenticated()
                return

    def tracked_names(self) -> tuple[str, ...]:
        return TRACKED_DEFAULT + tuple(self.runtime.config.track_extra_parameters)

    def _admin_role(self, user: str) -> str | None:
        config = self.runtime.config
        if user in config.admin_users:
            return "admin"
        if user in config.stats_users:
            return "stats"
        return None

    def _peer_uid(self) -> int | None:
        """The OS user id of a unix-socket peer (SO_PEERCRED); None over TCP."""
        transport = self.transport
        sock = transport.get_extra_info("socket") if transport is not None else None
        if sock is None or sock.family != socket.AF_UNIX:
            return None
        try:
            pid, uid, _gid = _PEERCRED.unpack(
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
            )
        except (OSError, AttributeError):
            return None
        self.peer_pid = pid
        return int(uid)

    def _peer_os_user(self) -> str | None:
        uid = self._peer_uid()
        return os_user_name(uid) if uid is not None else None

    def _same_os_user(self) -> bool:
        """A unix-socket peer running as the same OS user as this process."""
        return self._peer_uid() == os.getuid()

    def _admin_ready(self) -> None:
        """Logged in to the admin console: welcome, then commands."""
        if self.admin_role is None:
            # After authentication, so that the refusal says nothing about the password.
            raise PgtarnError("not allowed: not in admin_users or stats_users",
                              sqlstate="28000")
        self.auth = None
        welcome = dict(ADMIN_WELCOME)
        application_name = self.startup_params.get("application_name")
        if application_name is not None:
            welcome["application_name"] = application_name
            self.params["application_name"] = application_name
        out = bytearray()
        if self.negotiate_minor is not None:
            out += build.negotiate_protocol_version(*self.negotiate_minor)
        for name, value in welcome.items():
            out += build.parameter_status(name, value)
        self.cancel_key = (secrets.randbits(31), secrets.randbits(32))
        out += build.backend_key_data(*self.cancel_key)
        out += RFQ_IDLE
        self.admin = AdminSession(self, self.runtime, self.admin_role == "admin")
        self.state = State.ADMIN
        if self.runtime.config.log_connections:
            log.info("%r: admin console login (%s)", self, self.admin_role)
        self.write(bytes(out))

    def _authenticated(self) -> None:
        assert self.auth is not None
        if self.db is None:
            self._admin_ready()
            return
        registry = self.runtime.registry
        pool = registry.get_pool(self.db, self.user)
        self.pool = pool
        self.stats = pool.stats
        pool.stats.client_logins += 1
        self.pool_mode = pool.pool_mode
        self.statement_mode = pool.pool_mode == "statement"
        if self.auth.scram_keys is not None and self.db.user is None:
            pool.scram_keys = self.auth.scram_keys
        self.auth = None
        if self.database in self.runtime.registry.disabled:
            raise PgtarnError(f'database "{self.database}" is disabled', sqlstate="08P01")
        if pool.welcome is None:
            self.state = State.WELCOME
            pool.wait_welcome(self)
        else:
            self.welcome_ready()

    def welcome_ready(self) -> None:
        """The pool knows the server's parameters: finish this client's login."""
        pool = self.pool
        assert pool is not None and pool.welcome is not None
        welcome = dict(pool.welcome)
        for name in self.tracked_names():
            value = self.startup_params.get(name, welcome.get(name))
            if value is not None:
                self.params[name] = value
                welcome[name] = value
        out = bytearray()
        if self.negotiate_minor is not None:
            out += build.negotiate_protocol_version(*self.negotiate_minor)
        for name, value in welcome.items():
            out += build.parameter_status(name, value)
        self.cancel_key = (secrets.randbits(31), secrets.randbits(32))
        self.runtime.cancel_keys[self.cancel_key] = self
        out += build.backend_key_data(*self.cancel_key)
        out += RFQ_IDLE
        self.state = State.READY
        self.idle_since = monotonic()
        config = self.runtime.config
        watch = STATEMENT_RELAY_TYPES if self.statement_mode else RELAY_TYPES
        if pool.pool_mode == "transaction" and config.max_prepared_statements > 0:
            # The framer starts with the client's first Parse/Bind/Describe/Close.
            self.statements = ClientStatements(self.runtime.statement_cache)
            watch = WATCH_STATEMENTS_TYPES
        self.scanner = MessageScanner(
            watch, config.max_packet_size, bodies=frozenset(),  # only counted, never read
        )
        self.write(bytes(out))

    def _cancel_request(self, packet: StartupPacket) -> None:
        """Forward a CancelRequest to the backend now running this client's query, if any."""
        assert packet.cancel_key is not None
        target = self.runtime.cancel_keys.get(packet.cancel_key)
        if target is not None and target.server is not None:
            target.server.send_cancel(target)
        self.runtime.clients.discard(self)
        self.state = State.CLOSED
        if self.transport is not None:
            self.transport.close()

    # --- linking to servers --------------------------------------------------------------------

    def server_assigned(self, server: ServerConnection) -> None:
        """The pool lends us a server: set differing parameters, then send what waited."""
        self.waiting = False
        self.wait_notified = False
        if self.state is not State.READY:
            assert self.pool is not None
            self.pool.release(server)
            return
        self._link(server)
        if self.pending:
            pending = self.pending
            if len(pending) == 1 and isinstance(pending[0], bytes):
                data = pending[0]
            else:
                data = b"".join([self._encode(server, item) for item in pending])
            self.pending.clear()
            if self.pending_size > PENDING_PAUSE and self.transport is not None:
                self.transport.resume_reading()
            self.pending_size = 0
            server.write(data)

    def _link(self, server: ServerConnection) -> None:
        """Make server ours; SET the tracked parameters that differ on it."""
        self.server = server
        server.client = self
        if self.params.items() <= server.params.items():
            return
        differing = [
            (name, value)
            for name, value in self.params.items()
            if server.params.get(name) != value
        ]
        if differing:
            for name, value in differing:
                server.params[name] = value
            server.run_internal(
                [
                    "; ".join(
                        f"SET {build.quote_ident(name)} TO {build.quote_literal(value)}"
                        for name, value in differing
                    )
                ],
                None,
            )

    def waiting_too_long(self) -> None:
        if not self.wait_notified:
            self.wait_notified = True
            self.write(WAIT_NOTICE)

    def server_unavailable(self, error: PgtarnError) -> None:
        self.waiting = False
        self.close(error)

    def timed_out(self, error: PgtarnError) -> None:
        """The janitor ends this client (a timeout): error, unless a reply is half sent."""
        self._close_after(self.server, error)

    def _close_after(self, server: ServerConnection | None, error: PgtarnError) -> None:
        """Close with error, unless server's reply was relayed only in part: an ErrorResponse
        in the middle of a message would corrupt the stream, so then just close."""
        if server is not None and not server.scanner.at_boundary:
            self.close_reason = error.message
            if self.transport is not None:
                self.transport.abort()  # half a message sent: nothing more is worth flushing
            self.runtime.clients.discard(self)
            return
        self.close(error)

    def ready_for_query(self, server: ServerConnection, status: bytes) -> bytes | None:
        """Called by the linked server at each ReadyForQuery; may end the link.

        Returns None to forward the ReadyForQuery as is, or bytes to send in its place.
        """
        start = self.query_start
        if start:
            # statistics, inlined (see PoolStats): the query ends, and maybe its transaction
            stats = self.stats
            assert stats is not None
            now = monotonic()
            elapsed = now - start
            bucket = bisect_left(BUCKETS, elapsed)
            stats.query_buckets[bucket] += 1
            stats.query_sum += elapsed
            if status == b"I":
                began = self.xact_start
                if began:
                    elapsed = now - began
                    bucket = bisect_left(BUCKETS, elapsed)
                    self.xact_start = 0.0
                stats.xact_buckets[bucket] += 1
                stats.xact_sum += elapsed
            elif not self.xact_start:
                self.xact_start = start
            # a pipelined query begins where the one before it ended
            self.query_start = now if self.expected > 1 else 0.0
            self.idle_since = now
        if self.expected > 0:
            self.expected -= 1
        if self.expected:
            return None
        mode = self.pool_mode
        if mode == "session":
            return None
        if status == b"I":
            self._unlink(server)
            return None
        if mode == "statement":
            # A transaction opened some other way (a function, a multi-statement query):
            # roll it back and end the client, as PgBouncer does.
            self._unlink(server)
            self.close(PgtarnError(
                "transaction blocks not allowed in statement pooling mode", sqlstate="0A000",
                severity="FATAL",
            ))
            return b""
        return None

    def _unlink(self, server: ServerConnection) -> None:
        self.server = None
        config = self.runtime.config
        server.reset_and_release(
            config.server_reset_query if config.server_reset_query_always else None
        )

    def server_lost(self, server: ServerConnection) -> None:
        """Our linked server died: the client's transaction is gone; tell it and close."""
        self.server = None
        if server.fatal and server.scanner.at_boundary:
            # PostgreSQL's own FATAL reached the client (terminated, shut down): that is
            # the reason it sees, not followed by a second error of ours
            self.close_reason = f"server sent FATAL {server.fatal}"
            self.close()
            return
        self._close_after(server, PgtarnError(
            "server connection crashed or was terminated", sqlstate="08006", severity="FATAL"))

    def _drop_server(self) -> None:
        """The client is gone: never hand a server back mid-transaction."""
        server = self.server
        if server is None:
            return
        self.server = None
        if server.transport is not None:
            server.transport.resume_reading()
        if self.expected:
            server.client = None
            server.close("client disconnected while a query was running")
            return
        config = self.runtime.config
        reset = (
            config.server_reset_query
            if self.pool_mode == "session" or config.server_reset_query_always
            else None
        )
        server.client = None
        server.pool.begin_reset(server)
        # A Sync first: it ends any extended-protocol batch the client left without one,
        # and the ReadyForQuery it returns gives the true transaction status.
        server.swallow += 1
        if server.statements is not None:
            server.statements.sync_sent()
            server.swallow_syncs += 1
        server.on_clean = lambda: server.reset_and_release(reset)
        server.write(build.SYNC)


def _may_forget_all(data: bytes) -> bool:
    """Cheap test before FORGETS_ALL: could data hold the word ALL in any case?"""
    return b"ALL" in data.upper()


def _opens_transaction(text: bytes) -> bool:
    """Whether a statement starts with BEGIN or START (TRANSACTION), ignoring comments."""
    text = text.lstrip()
    while text.startswith(b"--") or text.startswith(b"/*"):
        cut = text.find(b"\n") if text.startswith(b"--") else text.find(b"*/")
        if cut < 0:
            return False
        text = text[cut + (1 if text.startswith(b"--") else 2) :].lstrip()
    word = text[:5].lower()
    return word in _TRANSACTION_WORDS and (len(text) == 5 or not text[5:6].isalnum())


