"""ServerConnection: connect and log in to PostgreSQL, relay its replies, reset, cancel."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Protocol, cast

from .config import Config, DatabaseEntry
from .errors import PgtarnError, ProtocolViolation, TlsFailed
from .login_driver import LoginDriver
from .pool.pool import Pool
from .proto import build
from .proto.framing import MessageScanner
from .proto.messages import parse_fields, parse_parameter_status
from .proto.server_login import LOGIN_MAX, LoggedIn, ServerAuth, ServerLogin
from .runtime import Runtime
from .session.prepared import (
    AS_PARSE_COMPLETE,
    ERROR_HIDE,
    ERROR_REPLACE,
    FORGETS_ALL,
    FORWARD,
    PARSE_COMPLETE,
    READY_FORWARD,
    READY_RETRY,
    READY_UNHIDE,
    ClientStatements,
    ServerStatements,
)

log = logging.getLogger("pgtarn.server")

# While linked, only ReadyForQuery, ParameterStatus and ErrorResponse need a look.
RELAY_TYPES = frozenset(b"ZSE")
# With prepared statements: also ParseComplete and CloseComplete.
PREPARED_RELAY_TYPES = frozenset(b"ZSE123")
RFQ_LEN = 6
# Login failures that may pass by themselves: the pool retries while clients wait.
TRANSIENT_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300", "53000"})


class LinkedClient(Protocol):
    """What a server needs of the client it is lent to."""

    @property
    def statements(self) -> ClientStatements | None: ...

    def write(self, data: bytes) -> None: ...

    def ready_for_query(self, server: ServerConnection, status: bytes) -> bytes | None:
        """At each ReadyForQuery: None to forward it, or bytes to send in its place; the
        client may end the link here."""

    def server_lost(self, server: ServerConnection) -> None: ...

    def parameter_changed(self, name: str, value: str) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


def is_transient(error: PgtarnError) -> bool:
    """A login failure that may pass; a server breaking the protocol will not, so waiting
    clients get its error at once instead of after server_connect_timeout."""
    if isinstance(error, (ProtocolViolation, TlsFailed)):
        return False
    return error.sqlstate.startswith("08") or error.sqlstate in TRANSIENT_SQLSTATES


class ServerConnection(asyncio.Protocol):
    """One connection to PostgreSQL, lent to clients by its pool."""

    __slots__ = (
        "backend_key",
        "client",
        "close_needed",
        "closed",
        "connect_time",
        "connstr",
        "created_at",
        "db",
        "fatal",
        "id",
        "last_used",
        "local_addr",
        "login",
        "on_clean",
        "params",
        "peer",
        "pool",
        "runtime",
        "scanner",
        "statements",
        "status",
        "swallow",
        "swallow_syncs",
        "transport",
    )

    def __init__(self, runtime: Runtime, pool: Pool[ServerConnection], db: DatabaseEntry,
                 login: ServerLogin) -> None:
        self.runtime = runtime
        self.pool = pool
        self.db = db
        self.id = next(runtime.ids)
        self.connstr = pool.connstr
        #: The login in progress; None once logged in, or given up on.
        self.login: LoginDriver | None = LoginDriver(
            login, self, db.host, switched=self._switch_transport, logged_in=self._logged_in,
            failed=self._login_refused, tls_failed=self._tls_failed)
        self.transport: asyncio.Transport | None = None
        self.scanner = MessageScanner(RELAY_TYPES, runtime.config.max_packet_size)
        self.client: LinkedClient | None = None
        self.params: dict[str, str] = {}
        self.backend_key: tuple[int, int] = (0, 0)
        self.status = b"I"
        #: ReadyForQuery messages still to come whose replies are ours, not a client's.
        self.swallow = 0
        #: Of the swallowed ReadyForQuery, how many end a batch the statements track.
        self.swallow_syncs = 0
        self.on_clean: Callable[[], None] | None = None
        #: Prepared statements this server has (transaction mode), made on first use.
        self.statements: ServerStatements | None = None
        self.closed = False
        self.close_needed = False
        #: The message of a FATAL (or PANIC) PostgreSQL sent while linked: the client
        #: already knows why the server is about to go away.
        self.fatal = ""
        self.created_at = time.monotonic()
        self.last_used = self.created_at
        self.connect_time = time.time()  # for display only
        self.peer = ""
        self.local_addr = ""

    def __repr__(self) -> str:
        return f"S-{self.id}({self.pool.database}/{self.pool.user}@{self.peer})"

    # --- connection lifecycle -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.closed:  # given up on (server_connect_timeout) while connecting
            transport.close()
            return
        self.transport = cast(asyncio.Transport, transport)
        transport = self.transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.runtime.config.tcp_keepalive:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer or "unix")
        local = transport.get_extra_info("sockname")
        self.local_addr = f"{local[0]}:{local[1]}" if isinstance(local, tuple) else "unix"
        assert self.login is not None  # not closed: still logging in
        self.login.start(transport, self.runtime.server_tls,
                         self.runtime.config.server_tls_sslmode)

    # --- the login's reports ----------------------------------------------------------------

    def _switch_transport(self, transport: asyncio.Transport) -> None:
        self.transport = transport

    def _logged_in(self, result: LoggedIn) -> None:
        self.login = None
        self.params = result.params
        self.backend_key = result.backend_key
        config = self.runtime.config
        if self.pool.pool_mode == "transaction" and config.max_prepared_statements > 0:
            self.statements = ServerStatements(config.max_prepared_statements,
                                               self.pool.prepared_counters)
            self.scanner = MessageScanner(PREPARED_RELAY_TYPES, config.max_packet_size)
        if result.leftover:  # sent unasked right behind the login: no client's yet
            self.data_received(result.leftover)
            if self.closed:
                return
        if config.log_connections:
            log.info("%r: new server connection", self)
        self.pool.server_ready(self, self.params)

    def _login_refused(self, error: PgtarnError) -> None:
        self.login = None
        self.close(error.message)
        self._login_failed(error)

    def _tls_failed(self, exc: Exception) -> None:
        if self.closed:
            return
        self.closed = True
        error = TlsFailed(f"could not connect to server: TLS: {exc}", severity="FATAL")
        if self.runtime.config.log_disconnections:
            log.info("%r: closing: %s", self, error.message)
        if self.login is not None:
            self.login = None
            self._login_failed(error)

    def connection_failed(self, exc: BaseException) -> None:
        """The TCP/unix connect itself failed."""
        if self.closed:
            return
        self.closed = True
        error = PgtarnError(
            f"could not connect to server: {exc}", sqlstate="08006", severity="FATAL"
        )
        self.login = None
        self._login_failed(error)

    def _login_failed(self, error: PgtarnError) -> None:
        if self.runtime.config.log_pooler_errors:
            log.warning("%r: %s", self, error.message)
        self.pool.server_login_failed(self, error, retry=is_transient(error))

    def connection_lost(self, exc: Exception | None) -> None:
        was_closed = self.closed
        self.closed = True
        if self.login is not None:
            self.login = None
            self._login_failed(PgtarnError(
                "server closed the connection during login", sqlstate="08006", severity="FATAL"
            ))
            return
        client = self.client
        if client is not None:
            self.client = None
            client.server_lost(self)
        if not was_closed and self.runtime.config.log_disconnections:
            log.info("%r: server connection lost", self)
        self.pool.server_closed(self)

    def close(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        if self.runtime.config.log_disconnections:
            log.info("%r: closing: %s", self, reason)
        if self.login is not None:
            self.login = None
            self._login_failed(PgtarnError(
                f"could not log in to server: {reason}", sqlstate="08006", severity="FATAL"
            ))
        if self.transport is not None:
            if not self.transport.is_closing():
                self.transport.write(build.TERMINATE)
            self.transport.close()

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

    # --- bytes from PostgreSQL ----------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        try:
            if self.login is not None:
                self.login.data_received(data)
            elif self.statements is None:
                self._relay(data)
            else:
                self._relay_prepared(data)
        except PgtarnError as error:
            log.warning("%r: %s", self, error.message)
            self._relay_whole_messages_before(data)
            self.close(error.message)

    def _relay_whole_messages_before(self, data: bytes) -> None:
        """The scanner refused a length in data: pass on what came before it, so the client
        stands at a message boundary and can be told why it loses its server."""
        client = self.client
        at = self.scanner.error_at
        if client is not None and self.statements is None and at >= 0:
            client.write(data[:at])
            self.scanner = MessageScanner(RELAY_TYPES)  # at a boundary again

    def _relay(self, data: bytes) -> None:
        events = self.scanner.feed(data)
        start = 0
        for msg_type, body, end in events:
            if self.swallow:
                if self._swallowed(msg_type, body):
                    start = end
                continue
            if msg_type == 0x5A:
                self.status = body
                client = self.client
                if client is None:
                    start = end
                    continue
                replacement = client.ready_for_query(self, body)
                if replacement is None:
                    client.write(data[start:end] if start or end != len(data) else data)
                else:
                    client.write(data[start : end - RFQ_LEN] + replacement)
                start = end
            elif msg_type == 0x53:
                self._parameter_status(body)
            elif msg_type == 0x45:
                self._relayed_error(body)
        if start < len(data) and not self.swallow and self.client is not None:
            self.client.write(data[start:] if start else data)

    def _relay_prepared(self, data: bytes) -> None:
        """_relay, plus the bookkeeping of prepared statements: ParseComplete, BindComplete and
        CloseComplete answered or dropped, errors held back for a retry or replaced, batches
        of pgtarn's own swallowed.

        Messages the scanner watches are held back until complete, so that one can be dropped
        or replaced; one that began in an earlier chunk is rebuilt from its body.
        """
        scanner = self.scanner
        statements = self.statements
        assert statements is not None
        events = scanner.feed(data)
        if (len(events) == 1 and not self.swallow and not scanner.held and not scanner.released
                and events[0][0] == 0x5A and events[0][2] == len(data) >= RFQ_LEN):
            # The common case: a whole reply ending with ReadyForQuery, nothing to rewrite.
            body = events[0][1]
            self.status = body
            client = self.client
            code = statements.ready(body, None if client is None else client.statements)
            if code == READY_FORWARD and client is not None and not statements.expected:
                replacement = client.ready_for_query(self, body)
                client.write(data if replacement is None else data[:-RFQ_LEN] + replacement)
                return
            reply = data[:-RFQ_LEN] + self._after_ready(code, data[-RFQ_LEN:], body)
            if reply and client is not None:
                client.write(reply)
            return
        out = bytearray(scanner.released if not self.swallow else b"")
        start = 0
        for msg_type, body, end in events:
            msg_start = end - 5 - len(body)
            piece = None
            if msg_start < 0:  # began in held-back bytes: rebuild it
                piece = _rebuild(msg_type, body)
                msg_start = start = end
            if self.swallow:
                if msg_type in (0x31, 0x32, 0x33):
                    statements.reply(msg_type)
                    continue
                if self.swallow_syncs:  # a batch the statements track: hidden, or our Sync
                    if msg_type == 0x5A:
                        self.swallow_syncs -= 1
                        statements.ready(body, None)
                    elif msg_type == 0x45:
                        statements.error(body, self.runtime.statement_cache)
                if self._swallowed(msg_type, body):
                    start = end
                    self.start_hidden()
                continue
            if msg_type in (0x31, 0x32, 0x33):
                action = statements.reply(msg_type)
                if action == FORWARD and piece is None:
                    continue
                out += data[start:msg_start]
                start = end
                if action == FORWARD:
                    out += piece or b""
                elif action == AS_PARSE_COMPLETE:
                    out += PARSE_COMPLETE
                continue
            out += data[start:msg_start]
            start = end
            message = piece if piece is not None else data[msg_start:end]
            if msg_type == 0x5A:
                client = self.client  # the link may end here
                code = statements.ready(body, None if client is None else client.statements)
                out += self._after_ready(code, message, body)
                if client is not None and out:
                    client.write(bytes(out))
                out.clear()
                continue
            if msg_type == 0x45:
                action = statements.error(body, self.runtime.statement_cache)
                if action == ERROR_HIDE:
                    continue
                if action == ERROR_REPLACE:
                    message = _rebuild(0x45, statements.replacement)
                else:
                    self._relayed_error(body)
            elif msg_type == 0x53:
                self._parameter_status(body)
            out += message
        if self.swallow or self.client is None:
            return
        out += data[start : len(data) - scanner.held]
        if out:
            self.client.write(bytes(out))

    def _after_ready(self, code: int, message: bytes, body: bytes) -> bytes:
        """A ReadyForQuery of a prepared-statement server: what the client gets for it."""
        statements = self.statements
        assert statements is not None
        self.status = body
        if code == READY_RETRY:
            # The batch failed only because its statement's plan went stale: send it again.
            resend, statements.resend = statements.resend, b""
            self.write(resend)
            self.start_hidden()
            return b""
        client = self.client
        if client is None:
            return b""
        if code == READY_UNHIDE:  # no retry after all: the client gets the error
            message = _rebuild(0x45, statements.withheld) + message
        replacement = client.ready_for_query(self, body)
        self.start_hidden()
        if replacement is not None:
            return message[:-RFQ_LEN] + replacement
        return message

    def start_hidden(self) -> None:
        """At a ReadyForQuery: if a batch of pgtarn's own comes next, swallow its replies."""
        statements = self.statements
        if not self.swallow and statements is not None and statements.take_hidden():
            self.swallow = 1
            self.swallow_syncs += 1

    def prepared_statements(self) -> ServerStatements:
        """This server's statement bookkeeping (made on first use)."""
        if self.statements is None:
            config = self.runtime.config
            self.statements = ServerStatements(config.max_prepared_statements,
                                               self.pool.prepared_counters)
            # Made while linked and idle, so the scanner is between messages.
            self.scanner = MessageScanner(PREPARED_RELAY_TYPES, config.max_packet_size)
        return self.statements

    def _swallowed(self, msg_type: int, body: bytes) -> bool:
        """A reply to pgtarn's own query, not passed on; True at its ReadyForQuery."""
        if msg_type == 0x5A:
            self.status = body
            self.swallow -= 1
            if self.swallow == 0 and self.on_clean is not None:
                on_clean, self.on_clean = self.on_clean, None
                on_clean()
            return True
        if msg_type == 0x53:
            self._parameter_status(body)
        elif msg_type == 0x45:
            fields = parse_fields(body)
            log.warning("%r: internal query failed: %s %s", self, fields.get("C"), fields.get("M"))
        return False

    def _relayed_error(self, body: bytes) -> None:
        """An ErrorResponse passed to the client: remember a FATAL, the server's last word."""
        fields = parse_fields(body)
        if fields.get("S") in ("FATAL", "PANIC"):
            self.fatal = f'{fields.get("C", "")} {fields.get("M", "")}'

    def _parameter_status(self, body: bytes) -> None:
        name, value = parse_parameter_status(body)
        self.params[name] = value
        client = self.client
        if client is not None:
            client.parameter_changed(name, value)

    # --- commands from the client side ----------------------------------------------------------

    def link(self, client: LinkedClient, params: dict[str, str]) -> None:
        """Lent to client: SET its tracked parameters that differ here, ahead of its bytes
        (their replies are swallowed, so no round trip is added)."""
        self.client = client
        if params.items() <= self.params.items():
            return
        differing = [(name, value) for name, value in params.items()
                     if self.params.get(name) != value]
        for name, value in differing:
            self.params[name] = value
        self.run_internal(["; ".join(
            f"SET {build.quote_ident(name)} TO {build.quote_literal(value)}"
            for name, value in differing)], None)

    def release_from(self, client: LinkedClient, mid_query: bool, reset_query: str | None
                     ) -> None:
        """client left while linked: close mid-query; otherwise clean up, then release."""
        if self.client is not client:
            return
        self.client = None
        self.resume_reading()
        if mid_query:
            self.close("client disconnected while a query was running")
            return
        self.pool.begin_reset(self)
        # A Sync first: it ends any extended-protocol batch the client left without one,
        # and the ReadyForQuery it returns gives the true transaction status.
        self.swallow += 1
        if self.statements is not None:
            self.statements.sync_sent()
            self.swallow_syncs += 1
        self.on_clean = lambda: self.reset_and_release(reset_query)
        self.write(build.SYNC)

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def run_internal(self, sql_statements: list[str], on_clean: Callable[[], None] | None) -> None:
        """Send queries whose replies are swallowed; call on_clean after the last one."""
        self.swallow += len(sql_statements)
        self.on_clean = on_clean
        self.write(b"".join(build.query(sql) for sql in sql_statements))

    def reset_and_release(self, reset_query: str | None) -> None:
        """Unlinked from its client: roll back / reset as needed, then go back to the pool."""
        self.client = None
        self.last_used = time.monotonic()
        if self.closed:
            return
        if self.status == b"I" and not reset_query:  # the common case: nothing to do
            self.pool.release(self)
            return
        statements = []
        if self.status != b"I":
            statements.append("ROLLBACK")
        if reset_query:
            statements.append(reset_query)
            if self.statements is not None and FORGETS_ALL.search(reset_query.encode()):
                self.statements.clear()
        self.pool.begin_reset(self)
        self.run_internal(statements, self._after_reset)

    def _after_reset(self) -> None:
        if self.status != b"I":
            self.close("reset left the server in a transaction")
            return
        self.pool.release(self)

    def start_check(self) -> None:
        """Idle too long: run server_check_query before reuse (a dead server closes)."""
        query = self.runtime.config.server_check_query
        self.last_used = time.monotonic()  # from now on: how long the check takes
        self.run_internal(["" if query == "<empty>" else query], self._after_check)

    def _after_check(self) -> None:
        self.last_used = time.monotonic()
        self._after_reset()

    def send_cancel(self, client: object) -> None:
        """Send a CancelRequest for this server's backend over a new connection.

        It is sent only if this server still runs client's work once the new connection is
        up, so a cancel never reaches a query of the client that got the server next.
        """
        pid, key = self.backend_key

        def still_linked() -> bool:
            return self.client is client and not self.closed

        self.runtime.spawn(
            send_cancel_request(self.db, pid, key, self.runtime.config, still_linked)
        )


def _rebuild(msg_type: int, body: bytes) -> bytes:
    """A whole message from its type and body."""
    return bytes((msg_type,)) + (len(body) + 4).to_bytes(4, "big") + body


async def open_connection(
    db: DatabaseEntry, factory: Callable[[], asyncio.Protocol], timeout: float,
    socket_dir: str = "/tmp",
) -> None:
    """Connect a protocol to a database entry's host: TCP or a unix socket directory.

    An entry without host connects through the unix socket in unix_socket_dir, as PgBouncer.
    """
    loop = asyncio.get_running_loop()
    host = db.host or socket_dir or "/tmp"
    if host.startswith("/"):
        path = os.path.join(host, f".s.PGSQL.{db.port}")
        coro = loop.create_unix_connection(factory, path)
    else:
        coro = loop.create_connection(factory, host, db.port)
    await asyncio.wait_for(coro, timeout or None)


async def send_cancel_request(db: DatabaseEntry, pid: int, key: int, config: Config,
                              still_wanted: Callable[[], bool]) -> None:
    """Open a connection and send a CancelRequest, giving up after cancel_wait_timeout.

    cancel_wait_timeout = 0 falls back to server_connect_timeout rather than waiting
    forever: a cancel nobody can deliver must not hold a task for good.
    """
    class _Once(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            if still_wanted():
                cast(asyncio.Transport, transport).write(build.cancel_request(pid, key))
            transport.close()

    timeout = config.cancel_wait_timeout or config.server_connect_timeout
    try:
        await open_connection(db, _Once, timeout, config.unix_socket_dir)
    except (TimeoutError, OSError) as exc:
        reason = str(exc) or (
            f"cancel_wait_timeout ({timeout:g} s)" if config.cancel_wait_timeout
            else f"cancel_wait_timeout (0: server_connect_timeout, {timeout:g} s)")
        log.warning("cancel request to %s:%s failed: %s", db.host, db.port, reason)


def server_login_for(runtime: Runtime, pool: Pool[ServerConnection], db: DatabaseEntry
                     ) -> ServerLogin:
    """Credentials for a new server of a pool.

    The password is the entry's own, else the auth_file secret of the pool's user. A stored
    SCRAM verifier cannot log in by itself: then the keys from a client's SCRAM login are
    used (SCRAM passthrough).
    """
    password = db.password if db.password is not None else runtime.userlist.get(pool.user)
    if password is None:
        password = runtime.looked_up(db, pool.user)  # auth_query found it at a client's login
    keys = None
    if password is not None and password.startswith("SCRAM-SHA-256$"):
        keys = pool.scram_keys
        password = None
    auth = ServerAuth(pool.user, password, keys, runtime.config.server_channel_binding)
    return ServerLogin(auth, db.dbname, db.startup_params,
                       min(runtime.config.max_packet_size, LOGIN_MAX))


def launch_server(runtime: Runtime, pool: Pool[ServerConnection], db: DatabaseEntry
                  ) -> ServerConnection:
    """Create a server connection and start connecting it in the background."""
    server = ServerConnection(runtime, pool, db, server_login_for(runtime, pool, db))

    async def connect() -> None:
        try:
            await open_connection(db, lambda: server, runtime.config.server_connect_timeout,
                                  runtime.config.unix_socket_dir)
        except (TimeoutError, OSError) as exc:
            server.connection_failed(exc if str(exc) else ProtocolViolation("timeout"))

    runtime.spawn(connect())
    return server

