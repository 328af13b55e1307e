"""A login to PostgreSQL on an asyncio transport: its credentials, and a ServerLogin driven."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Mapping
from typing import Any

from ..config import DatabaseEntry
from ..errors import PgtarnError
from ..net.tls import TlsTransport, peer_certificate_hash
from ..pool.pool import Pool
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

    __slots__ = ("connection", "context", "failed", "host", "logged_in", "login", "switched",
                 "tls_failed", "transport")

    def __init__(self, login: ServerLogin, connection: asyncio.Protocol, host: str | None, *,
                 switched: Callable[[asyncio.Transport], None],
                 logged_in: Callable[[LoggedIn], None],
                 failed: Callable[[PgtarnError], None],
                 tls_failed: Callable[[Exception], None]) -> None:
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

    def start(self, transport: asyncio.Transport, context: ssl.SSLContext | None,
              sslmode: str) -> None:
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
        tls = TlsTransport(self.transport, self.context, self.connection, server_side=False,
                           server_hostname=self.host, on_ready=self._tls_ready,
                           on_failed=self.tls_failed)
        self.transport = tls
        self.switched(tls)
        tls.start()

    def _tls_ready(self) -> None:
        assert isinstance(self.transport, TlsTransport)
        self.transport.write(self.login.tls_started(peer_certificate_hash(self.transport)))


def server_login_for(runtime: Runtime, pool: Pool[Any], db: DatabaseEntry,
                     application_name: str = "",
                     client_params: Mapping[str, str] | None = None) -> ServerLogin:
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
    return ServerLogin(auth, db.dbname, startup,
                       min(runtime.config.max_packet_size, LOGIN_MAX))
