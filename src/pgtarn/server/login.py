"""A login to PostgreSQL on an asyncio transport: its credentials, a ServerLogin driven, and
the connection of pgtarn's own (listener, auth_query, health check) built on it."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, cast

from ..config.settings import DatabaseEntry
from ..errors import PgtarnError, ProtocolViolation
from ..net.tls import TlsTransport, peer_certificate_hash
from ..pool.pool import Pool
from ..proto import build
from ..proto.framing import Event, MessageScanner
from ..proto.server_login import LOGIN_MAX, LoggedIn, Send, ServerAuth, ServerLogin
from ..runtime import Runtime


class LoginDriver:
    """Runs one ServerLogin for the connection that owns it (a server connection, or the
    auth_query lookup connection).

    The connection calls start() when connected and passes every chunk it receives to
    data_received() until the login ends. The driver writes what the login returns, puts a
    TlsTransport in place of the connection's transport when PostgreSQL accepts TLS, and
    reports through the connection's callbacks:

    - switched(transport): TLS wraps the connection; write through transport from now on;
    - logged_in(LoggedIn): done; the bytes left over are the connection's to handle;
    - failed(error): PostgreSQL refused the login, or broke the protocol (the connection is
      still open: the owner closes it);
    - tls_failed(exc): the TLS handshake failed (the connection is closed already).
    """

    __slots__ = (
        "connection",
        "context",
        "failed",
        "host",
        "logged_in",
        "login",
        "switched",
        "tls_failed",
        "transport",
    )

    def __init__(
        self,
        login: ServerLogin,
        connection: asyncio.Protocol,
        host: str | None,
        *,
        switched: Callable[[asyncio.Transport], None],
        logged_in: Callable[[LoggedIn], None],
        failed: Callable[[PgtarnError], None],
        tls_failed: Callable[[Exception], None],
    ) -> None:
        """host: the server's host name (checked against its certificate by verify-full)."""
        self.login = login
        self.connection = connection
        self.host = host or None
        self.switched = switched
        self.logged_in = logged_in
        self.failed = failed
        self.tls_failed = tls_failed
        self.transport: asyncio.Transport | None = None
        #: The TLS context in force when the SSLRequest went out (a RELOAD may replace it).
        self.context: ssl.SSLContext | None = None

    def start(
        self, transport: asyncio.Transport, context: ssl.SSLContext | None, sslmode: str
    ) -> None:
        """Connected: send an SSLRequest when TLS is on (context) and the connection is TCP
        (a unix socket is local already, as libpq has it), else the StartupMessage."""
        self.transport = transport
        if context is not None and isinstance(transport.get_extra_info("peername"), tuple):
            self.context = context
            transport.write(self.login.start(sslmode))
        else:
            transport.write(self.login.start())

    def data_received(self, data: bytes) -> None:
        """Bytes from PostgreSQL while logging in."""
        try:
            events = self.login.feed(data)
        except PgtarnError as error:
            self.failed(error)
            return
        for event in events:
            if isinstance(event, Send):
                assert self.transport is not None
                self.transport.write(event.data)
            elif isinstance(event, LoggedIn):
                self.logged_in(event)
            else:
                self._start_tls()

    def _start_tls(self) -> None:
        assert self.transport is not None and self.context is not None
        tls = TlsTransport(
            self.transport,
            self.context,
            self.connection,
            server_side=False,
            server_hostname=self.host,
            on_ready=self._tls_ready,
            on_failed=self.tls_failed,
        )
        self.transport = tls
        self.switched(tls)
        tls.start()

    def _tls_ready(self) -> None:
        assert isinstance(self.transport, TlsTransport)
        self.transport.write(self.login.tls_started(peer_certificate_hash(self.transport)))


class OwnConnection(asyncio.Protocol):
    """A connection of pgtarn's own to PostgreSQL: logs in as a server does, then reads replies.

    It connects, runs its LoginDriver, and once logged in feeds what PostgreSQL sends to its
    scanner, each reply to _message. A subclass implements its side of it:

    - _on_logged_in(): logged in (ready already; the bytes that came with the login's end are
      read after it);
    - _message(msg_type, body): one reply (of the types the scanner watches);
    - _malformed(error): the replies could not be read (the scanner, or _message, raised one
      of MALFORMED; a ValueError comes as a ProtocolViolation with its text);
    - _login_failed(error), _tls_failed(exc): the LoginDriver's reports of the same names.
    """

    #: What reading the replies may raise when PostgreSQL's bytes are malformed.
    MALFORMED: ClassVar[tuple[type[Exception], ...]] = (PgtarnError,)
    #: Whether what _message raises is caught as well (else only the scanner's errors are:
    #: a _message that reads nothing, only hands replies on, lets what it meets go up).
    MESSAGES_CHECKED: ClassVar[bool] = True

    def __init__(
        self, runtime: Runtime, login: ServerLogin, host: str | None, scanner: MessageScanner
    ) -> None:
        """host: the server's host name (for verify-full); scanner: reads the replies."""
        self.runtime = runtime
        self.transport: asyncio.Transport | None = None
        #: The login in progress; None once logged in, or given up on.
        self.login: LoginDriver | None = LoginDriver(
            login,
            self,
            host,
            switched=self._switch_transport,
            logged_in=self._logged_in,
            failed=self._login_failed,
            tls_failed=self._tls_failed,
        )
        #: The replies, after the login.
        self.scanner = scanner
        self.ready = False
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        if self.closed:
            transport.close()
            return
        assert self.login is not None  # not closed: still logging in
        self.login.start(
            self.transport, self.runtime.server_tls, self.runtime.config.server_tls_sslmode
        )

    def data_received(self, data: bytes) -> None:
        if self.login is not None:
            self.login.data_received(data)
            return
        try:
            events = self.scanner.feed(data)
            if self.MESSAGES_CHECKED:
                self._messages(events)
                return
        except self.MALFORMED as exc:
            self._malformed(exc if isinstance(exc, PgtarnError) else ProtocolViolation(str(exc)))
            return
        self._messages(events)

    def _messages(self, events: list[Event]) -> None:
        for msg_type, body, _end in events:
            self._message(msg_type, body)

    def _shut(self, terminate: bool = True) -> None:
        """Closed from our side: a Terminate first (when terminate), then the transport."""
        self.closed = True
        transport = self.transport
        if transport is not None and not transport.is_closing():
            if terminate:
                transport.write(build.TERMINATE)
            transport.close()

    # --- the login's reports ------------------------------------------------------------------

    def _switch_transport(self, transport: asyncio.Transport) -> None:
        self.transport = transport

    def _logged_in(self, result: LoggedIn) -> None:
        self.login = None
        self.ready = True
        self._on_logged_in()
        if result.leftover:
            self.data_received(result.leftover)

    # --- what a subclass implements -----------------------------------------------------------

    def _on_logged_in(self) -> None:
        raise NotImplementedError

    def _message(self, msg_type: int, body: bytes) -> None:
        raise NotImplementedError

    def _malformed(self, error: PgtarnError) -> None:
        raise NotImplementedError

    def _login_failed(self, error: PgtarnError) -> None:
        raise NotImplementedError

    def _tls_failed(self, exc: Exception) -> None:
        raise NotImplementedError


def server_login_for(
    runtime: Runtime,
    pool: Pool[Any],
    db: DatabaseEntry,
    application_name: str = "",
    client_params: Mapping[str, str] | None = None,
) -> ServerLogin:
    """Credentials for a new server of a pool (or its listener connection, named
    application_name; or a replication connection, with client_params, the client's own
    startup parameters, added).

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
    startup = db.startup_params
    if application_name:
        startup = {**startup, "application_name": application_name}
    if client_params:
        startup = {**startup, **client_params}
    return ServerLogin(auth, db.dbname, startup, min(runtime.config.max_packet_size, LOGIN_MAX))
