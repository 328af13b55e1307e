"""ServerConnection: a connection to PostgreSQL, from connect through login and loans to close.

Theory of operation. A pool launches a server (launch.py), which connects and logs in
(login.py's LoginDriver runs the sans-IO ServerLogin on the transport, TLS included), then
goes to its pool's idle servers. The pool lends it to a client (link: the client's tracked
parameters that differ here are SET ahead of the client's bytes, their replies swallowed);
every chunk PostgreSQL sends is relayed to the linked client (relay.py), and at each
ReadyForQuery the client may end the link. A client that leaves hands the server back
through release_from: mid-query the server closes; otherwise a Sync, then ROLLBACK and the
reset query as needed, and the server is released to its pool. An idle server runs
server_check_query before it is lent again (start_check).

The class extends ServerTransport (transport.py: fields and asyncio glue) and hands each
read to the relay (relay.py: RELAY, one object for every server, which holds no field);
this file adds the lifecycle (connect, login reports, close) and the commands of the client
side and the pool.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Final, Self, cast

from ..config.settings import DatabaseEntry
from ..errors import LoginRefused, PgtarnError, ProtocolViolation, TlsFailed
from ..net.sending import SEND_NEVER, send_state_of
from ..net.sockets import (
    address,
    connect_failure,
    open_connection,
    role_fits,
    send_cancel_request,
    targets,
    tune,
)
from ..pool.cancels import cancel_ended, cancel_started
from ..pool.handoffs import lend_marked
from ..pool.pool import Pool
from ..proto import build
from ..proto.framing import MessageScanner
from ..proto.msgtypes import PREPARED_RELAY_TYPES
from ..proto.server_login import LoggedIn, ServerLogin
from ..runtime import Runtime
from ..session.prepared import FORGETS_ALL, ServerStatements
from ..session.tracking import NO_SETTINGS
from .linked import LinkedClient
from .login import LoginDriver, server_login_for
from .relay import RELAY
from .transport import ServerTransport, log

#: workers = N: a server closed to give its slot to another worker waits this long at most
#: for PostgreSQL to close the connection.
SERVER_EXIT_WAIT = 5.0
#: A static in the compiled build (a module global costs a dictionary lookup per call).
monotonic: Final = time.monotonic
#: PostgreSQL's SQLSTATE for a cancelled statement.
QUERY_CANCELED: Final = "57014"
# Login failures that may pass by themselves: the pool retries while clients wait.
TRANSIENT_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300", "53000"})


def is_transient(error: PgtarnError) -> bool:
    """A login failure that may pass: clients keep waiting while the pool retries, as with
    PgBouncer, which gives waiting clients only PostgreSQL's refusals (and its own
    authentication failures) at once. A connect or TLS failure (a certificate not accepted
    today may be replaced) is such a failure; a server breaking the protocol is not, so
    waiting clients get its error at once instead of after query_wait_timeout."""
    if isinstance(error, TlsFailed):
        return True
    if isinstance(error, ProtocolViolation):
        return False
    return error.sqlstate.startswith("08") or error.sqlstate in TRANSIENT_SQLSTATES


class ServerConnection(ServerTransport):
    """One connection to PostgreSQL, lent to clients by its pool.

    Long: its lifecycle (connect, the login's reports, target_session_attrs, close) and the
    commands of the client side and the pool set the same few fields (login, client, closed,
    swallow, on_clean) in one order; the reply path, which reads alone, is relay.py's.
    """

    __slots__ = ()

    def __init__(
        self, runtime: Runtime, pool: Pool[ServerConnection], db: DatabaseEntry, login: ServerLogin
    ) -> None:
        super().__init__(runtime, pool, db)
        self.login = LoginDriver(
            login,
            self,
            db.host,
            switched=self._switch_transport,
            logged_in=self._logged_in,
            failed=self._login_refused,
            tls_failed=self._tls_failed,
        )

    # --- connection lifecycle -----------------------------------------------------------------

    def start_connecting(self) -> None:
        """Connect in the background to one of its entry's hosts; the login follows."""
        runtime, db = self.runtime, self.db

        async def connect() -> None:
            try:
                config = runtime.config
                self.target = await open_connection(
                    db,
                    lambda: self,
                    config.server_connect_timeout,
                    config.unix_socket_dir,
                    runtime.hosts,
                    self.hosts_tried,
                    config.tcp_socket_buffer,
                    self._host_failed,
                )
            except (TimeoutError, OSError) as exc:
                self.connection_failed(exc)

        runtime.spawn(connect())

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.closed:  # given up on (server_connect_timeout) while connecting
            transport.close()
            return
        self.transport = cast(asyncio.Transport, transport)
        self.send_state = send_state_of(transport)
        tune(transport, self.runtime.config.tcp_keepalive, self.runtime.tcp_options)
        self.peer = address(transport.get_extra_info("peername"))
        local = transport.get_extra_info("sockname")
        self.local_addr = address(local) if isinstance(local, tuple) else "unix"
        assert self.login is not None  # not closed: still logging in
        self.login.start(
            self.transport, self.runtime.server_tls, self.runtime.config.server_tls_sslmode
        )

    def data_received(self, data: bytes) -> None:
        """PostgreSQL's bytes: to the login while it runs, then to the relay."""
        self.in_read = True
        try:
            if self.login is not None:
                self.login.data_received(data)
            elif self.statements is None:
                RELAY.relay(self, data)
            elif self.long_reply is None:
                RELAY.relay_prepared(self, data)
            else:
                RELAY.relay_long(self, data)
        except PgtarnError as error:
            log.warning("%r %s", self, error.message)
            RELAY.relay_whole_messages_before(self, data)
            self.close(error.message)
        except BaseException:  # (a bug, which the loop reports: the read is over all the same)
            self.in_read = False
            if self.handoff_at:
                lend_marked(self.pool, self)
            raise
        self.in_read = False
        if self.handoff_at:  # released in this read to the clients waiting: lent now
            lend_marked(self.pool, self)

    # --- the login's reports ----------------------------------------------------------------

    def _switch_transport(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.send_state = SEND_NEVER  # (TLS)

    def _logged_in(self, result: LoggedIn) -> None:
        attrs = self.db.target_session_attrs
        if attrs and attrs != "any" and not self.replication and \
                not self._fits(attrs, result.params):  # fmt: skip
            return
        self.login = None
        self.params = result.params
        self.params_met = None
        self.backend_key = result.backend_key
        config = self.runtime.config
        if self.pool.pool_mode != "session" and config.max_prepared_statements > 0:
            self.statements = ServerStatements(
                config.max_prepared_statements, self.pool.prepared_counters
            )
            # (a long ErrorResponse or DataRow is decided from its head: server/longreply.py)
            self.scanner = MessageScanner(
                PREPARED_RELAY_TYPES,
                config.max_packet_size,
                stream_over=config.client_message_buffer,
            )
        if result.leftover:  # sent unasked right behind the login: no client's yet
            self.data_received(result.leftover)
            if self.closed:
                return
        if self.db.connect_query:
            # run once, its replies swallowed; still in the pool's login container meanwhile
            self.internal_error = None
            self.run_internal([self.db.connect_query], self._after_connect_query)
            return
        self._ready()

    def _after_connect_query(self) -> None:
        if self.internal_error is not None:
            sqlstate, message = self.internal_error
            error = PgtarnError(
                f"connect_query failed: {message}", sqlstate=sqlstate or "08P01", severity="FATAL"
            )
            self.close(error.message)
            self._login_failed(error)
            return
        self._ready()

    def _ready(self) -> None:
        if self.runtime.config.log_connections:
            log.info("%r new connection to server (from %s)", self, self.local_addr)
        self.pool.server_ready(self, self.params)

    def _login_refused(self, error: PgtarnError) -> None:
        """The login failed: PostgreSQL refused it (LoginRefused), or pgtarn could not go on
        (no usable password, a server breaking the protocol). PostgreSQL's message is the
        close reason and its clients' error as it is, as with PgBouncer."""
        self.login = None
        if isinstance(error, LoginRefused):
            log.warning("%r server login failed: %s %s", self, error.severity, error.message)
        self.close(error.message)
        self._login_failed(error)

    def _tls_failed(self, exc: Exception) -> None:
        if self.closed:
            return
        self.closed = True
        error = TlsFailed(f"could not connect to server: TLS: {exc}", severity="FATAL")
        if self.runtime.config.log_disconnections:
            log.info("%r closing because: %s", self, error.message)
        if self.login is not None:
            self.login = None
            self._login_failed(error)

    def _fits(self, attrs: str, params: Mapping[str, str]) -> bool:
        """target_session_attrs, as libpq: a host whose role does not fit is left for the
        next one of the list (the hosts are remembered, and tried last by later servers);
        when none fits, the login fails, but prefer-standby takes the last one tried."""
        hosts = targets(self.db, self.runtime.config.unix_socket_dir)
        index = hosts.index(self.target) if self.target in hosts else 0
        fits = role_fits(attrs, params)
        self.runtime.hosts.mark(self.db, index, fits)
        self.hosts_tried.add(index)
        if fits or (attrs == "prefer-standby" and len(self.hosts_tried) >= len(hosts)):
            return True
        transport = self.transport
        self.transport = None
        self.send_state = SEND_NEVER
        if transport is not None:
            self.stale_links += 1
            transport.write(build.TERMINATE)
            transport.close()
        if len(self.hosts_tried) >= len(hosts):
            self.closed = True
            self.login = None
            message = f"no server of the host list fits target_session_attrs={attrs}"
            if self.pool.split is not None:  # the home pool of read_write_split
                message = "no primary: no server of the host list takes writes"
            self._login_failed(PgtarnError(message, sqlstate="08006", severity="FATAL"))
            return False
        log.info(
            "%r %s:%s does not fit target_session_attrs=%s, trying the next host",
            self,
            *hosts[index],
            attrs,
        )
        self.login = LoginDriver(
            server_login_for(self.runtime, self.pool, self.db),
            self,
            self.db.host,
            switched=self._switch_transport,
            logged_in=self._logged_in,
            failed=self._login_refused,
            tls_failed=self._tls_failed,
        )
        self.start_connecting()
        return False

    def _host_failed(self, target: tuple[str, int], exc: BaseException, more: bool) -> None:
        """A host could not be reached: log lines name it from now on. When another host
        of the list is tried next (more), at once, this one is logged as PgBouncer logs the
        server connection it closes for it."""
        self.peer = "{}:{}".format(*target)
        if more and self.runtime.config.log_disconnections:
            log.info("%r closing because: %s; trying the next host", self, connect_failure(exc))

    def connection_failed(self, exc: BaseException) -> None:
        """The TCP/unix connect itself failed."""
        if self.closed:
            return
        self.closed = True
        reason = connect_failure(exc)
        if self.runtime.config.log_disconnections:
            log.info("%r closing because: %s", self, reason)
        error = PgtarnError(
            f"could not connect to server: {reason}", sqlstate="08006", severity="FATAL"
        )
        self.login = None
        self._login_failed(error)

    def refuse(self, message: str) -> None:
        """Fail this new server's login without connecting (soon: its pool adds it to the
        login container first); transient, so clients wait while the pool retries."""

        def fail() -> None:
            if not self.closed:
                self.closed = True
                self.login = None
                self._login_failed(PgtarnError(message, sqlstate="08006", severity="FATAL"))

        asyncio.get_running_loop().call_soon(fail)

    def _login_failed(self, error: PgtarnError) -> None:
        split = self.pool.split
        if split is not None and self.pool.host_index < 0 and split.hosts.primary is None \
                and type(error) in (PgtarnError, LoginRefused) \
                and error.message[:10] != "no primary":  # fmt: skip
            # a home pool's server while the checks know no primary: say so first
            error = type(error)(
                f"no primary: {error.message}", sqlstate=error.sqlstate, severity=error.severity
            )
        if self.runtime.config.log_pooler_errors and not isinstance(error, LoginRefused):
            log.warning("%r %s", self, error.message)  # (a refusal was logged as it came)
        self.pool.server_login_failed(self, error, retry=is_transient(error))

    def connection_lost(self: Self, exc: Exception | None) -> None:
        if self.stale_links:  # a host that did not fit target_session_attrs, left
            self.stale_links -= 1
            return
        was_closed = self.closed
        self.closed = True
        self.send_state = SEND_NEVER  # its socket closes once this returns
        if self.login is not None:
            self.login = None
            self._login_failed(
                PgtarnError(
                    "server closed the connection during login", sqlstate="08006", severity="FATAL"
                )
            )
            return
        client = self.client
        if client is not None:
            self.client = None
            client.server_lost(self)
        if not was_closed and self.runtime.config.log_disconnections:
            log.info("%r closing because: server connection lost", self)
        self.pool.server_closed(self)

    def close(self, reason: str, wait: bool = False) -> None:
        """Terminate, then close (wait: PostgreSQL closes, once its backend is gone from
        pg_stat_activity, or we do after SERVER_EXIT_WAIT seconds)."""
        if self.closed:
            return
        self.closed = True
        self.send_state = SEND_NEVER  # (what is written from here on goes through the transport)
        self.handoff_at = 0.0  # (released while clients waited: it goes to nobody now)
        idle = self.pool.idle
        if self.client is None and self in idle:  # (none is to be lent it until it is lost)
            idle.remove(self)
        if self.runtime.config.log_disconnections:
            log.info("%r closing because: %s", self, reason)
        if self.login is not None:
            self.login = None
            self._login_failed(
                PgtarnError(
                    f"could not log in to server: {reason}", sqlstate="08006", severity="FATAL"
                )
            )
        if self.transport is not None:
            if not self.transport.is_closing():
                self.transport.write(build.TERMINATE)
                if wait:
                    asyncio.get_running_loop().call_later(SERVER_EXIT_WAIT, self.transport.close)
                    return
            self.transport.close()

    # --- commands from the client side and the pool --------------------------------------------

    def watch_rows(self, on: bool) -> None:
        """The linked client reads the rows of a batch (on), or no longer (ServerRelay)."""
        RELAY.watch_rows(self, on)

    def watch_descriptions(self) -> None:
        """Replies to a Describe of a statement are owed: read them (ServerRelay)."""
        RELAY.watch_descriptions(self)

    def start_hidden(self) -> None:
        """At a ReadyForQuery: if a batch of pgtarn's own comes next, swallow its replies."""
        RELAY.start_hidden(self)

    def prepared_statements(self) -> ServerStatements:
        """This server's statement bookkeeping (made on first use)."""
        return RELAY.prepared_statements(self)

    def link(
        self,
        client: LinkedClient[ServerConnection],
        params: dict[str, str],
        settings: dict[str, str] | None = None,
    ) -> None:
        """Lent to client: SET its tracked parameters that differ here, and make the session
        settings its own (SET what differs, RESET what it never set), ahead of its bytes (their
        replies are swallowed, so no round trip is added). settings None: not tracked."""
        if self.in_read:  # the client would write to it inside the read that released it
            log.debug("%r lent to %r inside its own read", self, client)
        self.client = client
        same_settings = settings is None or settings is self.settings
        if same_settings and (params is self.params_met or params.items() <= self.params.items()):
            self.params_met = params
            return
        self.params_met = params  # true once the SETs below have run
        statements = []
        for name, value in params.items():
            if self.params.get(name) != value:
                self.params[name] = value
                statements.append(f"SET {build.quote_ident(name)} TO {build.quote_literal(value)}")
        if not same_settings:
            assert settings is not None
            statements.extend(_settings_change(self.settings, settings))
            self.settings = settings
        if statements:
            self.run_internal(["; ".join(statements)], None)

    def release_from(
        self,
        client: LinkedClient[ServerConnection],
        mid_query: bool,
        reset_query: str | None,
        settings: dict[str, str] | None = None,
        *,
        reason: str = "client disconnected while a query was running",
    ) -> None:
        """client left while linked: close mid-query (or when told why, reason); otherwise
        clean up, then release. settings: the session settings the client leaves here."""
        if self.client is not client:
            return
        self.client = None
        self.resume_reading()
        if mid_query:
            self.close(reason)
            return
        self.pool.begin_reset(self)
        # A Sync first: it ends any extended-protocol batch the client left without one,
        # and the ReadyForQuery it returns gives the true transaction status.
        self.swallow += 1
        if self.statements is not None:
            self.statements.sync_sent()
            self.swallow_syncs += 1
        self.on_clean = lambda: self.reset_and_release(reset_query, settings)
        self.write(build.SYNC)

    def run_internal(self, sql_statements: list[str], on_clean: Callable[[], None] | None) -> None:
        """Send queries whose replies are swallowed; call on_clean after the last one."""
        self.swallow += len(sql_statements)
        self.on_clean = on_clean
        self.write(b"".join(build.query(sql) for sql in sql_statements))

    def reset_and_release(
        self, reset_query: str | None, settings: dict[str, str] | None = None, now: float = 0.0
    ) -> None:
        """Unlinked from its client: roll back / reset as needed, then go back to the pool.
        settings: the session settings the client leaves (None: unchanged); now: the
        caller's reading of the clock, if it has one."""
        self.client = None
        self.last_used = now = now or monotonic()
        if self.closed:
            return
        if settings is not None:
            self.settings = settings
        if self.status == b"I" and not reset_query:  # the common case: nothing to do
            self.pool.release(self, now)
            return
        statements = []
        if self.status != b"I":
            statements.append("ROLLBACK")
        if reset_query:
            statements.append(reset_query)
            if FORGETS_ALL.search(reset_query.encode()):
                self.settings = NO_SETTINGS
                if self.statements is not None:
                    self.statements.clear()
        self.pool.begin_reset(self)
        self.internal_error = None
        self.run_internal(statements, self._after_reset)

    def _after_reset(self) -> None:
        if self.status != b"I":
            self.close("reset left the server in a transaction")
            return
        error = self.internal_error
        if error is not None and error[0] == QUERY_CANCELED:
            # a cancel sent for the last client's query landed on the reset: whatever that
            # client left may still be there
            self.close("the reset was cancelled")
            return
        self.pool.release(self)

    def start_check(self) -> None:
        """Idle too long: run server_check_query before reuse (a dead server closes)."""
        query = self.runtime.config.server_check_query
        self.last_used = time.monotonic()  # from now on: how long the check takes
        self.internal_error = None
        self.run_internal(["" if query == "<empty>" else query], self._after_check)

    def _after_check(self) -> None:
        self.last_used = time.monotonic()
        self._after_reset()

    def abandon(self, reason: str) -> None:
        """Its client was closed mid-query by a timeout (query_timeout, transaction_timeout):
        close it for reason, and send a CancelRequest for its backend, which would otherwise
        run the query on unattended (PostgreSQL notices a closed connection only when it next
        writes to it)."""
        if self.closed:
            return
        self.client = None  # closed with a reason of its own: not to be told of this close
        pid, key = self.backend_key
        self.close(reason)
        config = self.runtime.config
        self.runtime.spawn(send_cancel_request(self.target, pid, key, config, lambda: True))

    def send_cancel(self, client: object, done: Callable[[], None] | None = None) -> None:
        """Send a CancelRequest for this server's backend over a new connection; done (a
        client's CancelRequest: its connection closes then) is called when the cancel ended.

        It is sent only if this server still runs client's work once the new connection is
        up. Until PostgreSQL has closed that connection (it signals the backend first), or
        the cancel failed, the server goes to no other client, nor to client's next
        transaction: released meanwhile, its pool holds it (pool/cancels.py).
        """
        pid, key = self.backend_key
        pool = self.pool
        request = done is not None
        cancel_started(pool, self, request)

        def still_linked() -> bool:
            return self.client is client and not self.closed

        async def cancel() -> None:
            answered = False
            try:
                answered = await send_cancel_request(
                    self.target, pid, key, self.runtime.config, still_linked
                )
            finally:
                if not answered and not self.closed:
                    log.warning(
                        "%r its cancel request may still arrive: it is closed "
                        "rather than lent again",
                        self,
                    )
                cancel_ended(pool, self, request, answered)
                if done is not None:
                    done()

        self.runtime.spawn(cancel())


def _settings_change(current: dict[str, str], wanted: dict[str, str]) -> list[str]:
    """The statements that turn a session's settings from current into wanted."""
    statements = [sql for name, sql in wanted.items() if current.get(name) != sql]
    statements.extend(f"RESET {_setting_name(name)}" for name in current if name not in wanted)
    return statements


def _setting_name(name: str) -> str:
    """A setting's name as SQL (a custom one has a dot: each part is an identifier)."""
    return ".".join(build.quote_ident(part) for part in name.split("."))
