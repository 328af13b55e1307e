"""ClientConnection: an application connection, from accept through login to close.

Theory of operation. A client goes STARTUP -> AUTH -> (WELCOME) -> READY. In READY every
received chunk goes to the relay (relay.py), which notices only Query, Sync and Terminate:
each Query or Sync means one ReadyForQuery to come. The first message that finds no server
linked asks the pool for one; until it comes the bytes wait in ``pending``. The server calls
``ready_for_query`` on each ReadyForQuery; when none is outstanding and the mode allows it
(transaction: status idle; statement: always) the link ends and the server goes back to its
pool (link.py). Before a server is linked, the client's tracked parameters that differ on
that server are SET in front of the client's own bytes, and their replies are swallowed, so
no round trip is added.

The class is assembled from ClientTransport (transport.py: fields and asyncio glue),
ClientLink (link.py) and ClientRelay (relay.py), one job per file; this file adds the login.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import ssl
from time import monotonic
from typing import cast

from .. import __version__
from ..admin.console import AdminSession
from ..errors import AuthFailed, PgtarnError, ProtocolViolation
from ..net.tls import ALPN, TlsTransport, certificate_name, describe, has_certificate
from ..pool.pool import Pool
from ..proto import build
from ..proto.client_side import ClientAuth
from ..proto.framing import MessageScanner
from ..proto.messages import (
    CANCEL_REQUEST,
    GSSENC_REQUEST,
    SSL_REQUEST,
    StartupPacket,
    parse_startup,
)
from ..server.connection import ServerConnection
from ..session.prepared import ClientStatements
from ..states import ClientState
from ..views import SecretSource
from .access import Connection, auth_method, os_user_name, peer_address, peer_credentials
from .relay import RFQ_IDLE, ClientRelay

log = logging.getLogger("pgtarn.client")

# In READY only these client messages matter: Query, Sync, Terminate.
RELAY_TYPES = frozenset(b"QSX")
STATEMENT_RELAY_TYPES = frozenset(b"QSXP")
# Transaction mode before a client's first Parse/Bind/Describe/Close: those are noticed too.
WATCH_STATEMENTS_TYPES = frozenset(b"QSXPBDC")
TRACKED_DEFAULT = (
    "client_encoding",
    "DateStyle",
    "TimeZone",
    "standard_conforming_strings",
    "application_name",
)
#: Methods that need the user's secret, which auth_query may find when auth_file has none.
LOOKED_UP = frozenset({"md5", "scram-sha-256", "plain", "trust", "any"})
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


class ClientConnection(ClientRelay):
    """One application connection (see the module docstring)."""

    __slots__ = ()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.runtime.clients.add(self)
        self.runtime.logins.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.state is ClientState.CLOSED and self not in self.runtime.clients:
            return
        previous = self.state
        self.state = ClientState.CLOSED
        runtime = self.runtime
        runtime.clients.discard(self)
        runtime.logins.discard(self)
        runtime.cancel_keys.pop(self.cancel_key, None)
        if self.admin is not None:
            runtime.admin_clients.discard(self)
            self.admin.closed()
        if self.statements is not None:
            self.statements.clear()  # the shared cache keeps only what live clients name
        if self.pool is not None:
            self.pool.client_left(self)
            self.waiting = False
        self._drop_server()
        if (self.pool is not None or self.admin is not None) \
                and self.runtime.config.log_disconnections:
            if self.close_reason:
                reason = self.close_reason
            elif previous is ClientState.CLOSED:  # it sent Terminate
                reason = "client close request"
            elif exc is None:
                reason = "client closed the connection"
            else:
                reason = f"client connection error: {exc}"
            log.info("%r: closing because: %s (age=%ds)", self, reason,
                     monotonic() - self.created_at)
        self.runtime.on_client_gone()


    def data_received(self, data: bytes) -> None:
        try:
            if self.state is ClientState.READY:
                stats = self.stats
                assert stats is not None
                stats.received += len(data)
                if not self.query_start:
                    self.query_start = self.last_request = monotonic()
                if self.framer is None:
                    self._relay(data)
                else:
                    self._relay_prepared(data)
            elif self.state is ClientState.STARTUP:
                self._startup(data)
            elif self.state is ClientState.AUTH:
                self._auth_data(data)
            elif self.state is ClientState.ADMIN:
                assert self.admin is not None
                self.admin.feed(data)
            elif self.state is ClientState.WELCOME:
                raise ProtocolViolation("message received before ReadyForQuery")
        except PgtarnError as error:
            self.close(error)

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
        if rest and self.state is ClientState.AUTH:
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
                self.state = ClientState.AUTH
                self.secret_lookup = lookup
                self.runtime.spawn(self._look_up(lookup, auth_type, user))
                return
        self._start_auth(auth_type, user, secret)

    async def _look_up(self, lookup: SecretSource, auth_type: str, user: str) -> None:
        try:
            secret = await lookup.secret(user)
            if self.state is ClientState.AUTH and self.auth is None:  # still there, still waiting
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
        self.state = ClientState.AUTH
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
        """The OS user id of a unix-socket peer; None over TCP."""
        credentials = peer_credentials(self.transport)
        if credentials is None:
            return None
        self.peer_pid = credentials[0]
        return credentials[1]

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
        self.state = ClientState.ADMIN
        self.runtime.logins.discard(self)
        self.runtime.admin_clients.add(self)
        if self.runtime.config.log_connections:
            log.info("%r: admin console login (%s)", self, self.admin_role)
        self.write(bytes(out))

    def _authenticated(self) -> None:
        assert self.auth is not None
        if self.db is None:
            self._admin_ready()
            return
        self.runtime.logins.discard(self)
        # the registry holds servers as views; this pool's are ServerConnections
        pool = cast(Pool[ServerConnection], self.runtime.registry.get_pool(self.db, self.user))
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
            self.state = ClientState.WELCOME
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
        self.state = ClientState.READY
        pool.client_joined(self)
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
        self.state = ClientState.CLOSED
        if self.transport is not None:
            self.transport.close()

