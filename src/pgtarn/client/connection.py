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

The login is its own part (login.py, ClientLoginDriver): it drives the sans-IO machine
(proto/client_login.py) from the first packet until the client authenticated, then hands
over to this class (authenticated): the pool or the admin console, and the welcome, after
which the part is dropped. The LISTEN state is another part (listening.py), made at first
use.

The session tracking of a transaction-mode client is a third part (tracking.py,
SessionTracking), made at first use: the texts that may change its session state, its
batches' effects, its pins.

ClientTransport (transport.py: its fields and asyncio glue) is its base; this file adds
accept, the welcome and close. The link (link.py) and the relay (relay.py) are parts that
hold no field: one object each for every client, handed the client at each call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, NoReturn, cast

from ..admin.console import PARAMETERS, TRACKED, AdminSession
from ..errors import PgtarnError
from ..net.sending import SEND_NEVER
from ..net.transport import CLOCK
from ..pool.pool import Pool
from ..pool.split import ClientRoute
from ..proto import build
from ..proto.cancelkey import as_issued, peer_of, worker_of
from ..proto.client_login import ClientLogin
from ..runtime import Coordinator, Runtime
from ..server.connection import ServerConnection
from ..server.replication import ReplicationServer, request_replication
from ..session.effects import Parsed
from ..session.tracking import SessionTracker
from ..views.states import READY_STATE, ClientState
from .large import ClientLargeMessage
from .link import LINK
from .listening import ClientListen
from .login import ClientLoginDriver, login_settings, tracked_names
from .relay import RELAY
from .tracking import SessionTracking
from .transport import NO_KEY, ClientTransport, PendingParts

#: A static in the compiled build (a module global costs a dictionary lookup per call).
monotonic: Final = time.monotonic
log = logging.getLogger("pgtarn.client")

READY_FOR_QUERY_LEN = 6


class ClientConnection(ClientTransport):
    """One application connection (see the module docstring)."""

    __slots__ = ("login",)

    def __init__(self, runtime: Runtime) -> None:
        super().__init__(runtime)
        #: Its login until the welcome (None from then on, or once the client is gone).
        self.login: ClientLoginDriver | None = ClientLoginDriver(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        runtime = self.runtime
        if self.cancel_key == NO_KEY:  # (a handed-over client comes with its own: adopt)
            self.cancel_key = runtime.new_key()
        if not runtime.add_client(
            self.cancel_key, self
        ):  # its own key is another's here, since adopt asked
            log.warning(
                "%r its cancel key is in use here: it gets a new one, and a "
                "CancelRequest with the old one does not reach it",
                self,
            )
            self.cancel_key = runtime.new_key()
            runtime.add_client(self.cancel_key, self)
        runtime.logins.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.send_state = SEND_NEVER  # its socket closes once this returns
        self.login = None  # (a login that goes on no more; it holds the client: a cycle)
        runtime = self.runtime
        # (one lookup: a client already closed and gone from the runtime has nothing to undo)
        if not runtime.remove_client(self.cancel_key, self) and self.state is ClientState.CLOSED:
            return
        previous = self.state
        self.state = ClientState.CLOSED
        self.schema_change_ended()  # its server rolls back whatever DDL was under way
        runtime.logins.discard(self)
        if runtime.limits is not None:
            runtime.limits.left(self)
        if self.admin is not None:
            runtime.admin_clients.discard(self)
            self.admin.closed()
        if self.statements is not None:
            self.statements.clear()  # the shared cache keeps only what live clients name
        if self.pool is not None:
            self._leave_pool()
            self.waiting = False
            self._stop_listening()
        LINK.drop_server(self)
        # every client past its StartupMessage (not a probe that sent nothing)
        if login_settings(runtime.config).log_disconnections and (
            self.database or self.close_reason or self.pool is not None
        ):
            if self.close_reason:
                reason = self.close_reason
            elif previous is ClientState.CLOSED:  # it sent Terminate
                reason = "client close request"
            elif exc is None:
                reason = "client closed the connection"
            else:
                reason = f"client connection error: {exc}"
            self.log_closing(reason)  # (unless close() has written it)
        self.runtime.on_client_gone()

    def data_received(self, data: bytes) -> None:
        try:
            if self.state is READY_STATE:
                pool = self.pool
                assert pool is not None
                pool.stats.received += len(data)
                if not self.query_start:
                    now = CLOCK.now  # (the wake-up's reading: see LoopClock)
                    if not now:
                        now = monotonic()
                    self.query_start = self.last_request = now
                large = self.large
                if large is not None:  # a message too long to hold, in pieces (large.py)
                    data = large.receive(data)
                    if large.done:
                        self.large = None
                    if not data:
                        return
                if self.route is not None and self.server is None and LINK.route_start(self, data):
                    return
                if self.framer is None:
                    try:
                        RELAY.relay(self, data)
                    finally:  # a lent scanner goes back, or becomes the client's own
                        self.scanner = self.scanner.kept()
                else:
                    RELAY.relay_prepared(self, data)
                large = self.large
                if large is not None and large.first and self.state is READY_STATE:
                    self._begin_large(large)
            elif self.state is ClientState.ADMIN:
                assert self.admin is not None
                self.admin.feed(data)
            elif self.state is ClientState.REPLICATION:  # its own server: as it is
                server = self.server
                assert server is not None and self.pool is not None
                self.pool.stats.received += len(data)
                server.write(data)
            elif self.login is not None and self.state is not ClientState.CLOSED:
                self.login.receive(data)
        except PgtarnError as error:
            self.close(error)

    # --- the link (link.py): what the pool, its server and the janitor ask of a client --------

    def server_assigned(self, server: ServerConnection) -> None:
        LINK.server_assigned(self, server)

    def statements_checked(self) -> None:
        LINK.statements_checked(self)

    def waiting_too_long(self) -> None:
        LINK.waiting_too_long(self)

    def server_unavailable(self, error: PgtarnError) -> None:
        LINK.server_unavailable(self, error)

    def parameter_changed(self, name: str, value: str, hidden: bool) -> None:
        LINK.parameter_changed(self, name, value, hidden)

    def timed_out(self, error: PgtarnError) -> None:
        LINK.timed_out(self, error)

    def ready_for_query(self, server: ServerConnection, status: bytes) -> bytes | None:
        return LINK.ready_for_query(self, server, status)

    def server_lost(self, server: ServerConnection) -> None:
        LINK.server_lost(self, server)

    # --- what its parts ask of it (interfaces.py): the link's and the relay's ways, its parts --

    def _link_ends(self, server: ServerConnection, status: bytes) -> bytes | None:
        return LINK.link_ends(self, server, status)

    def _send_pending(self) -> None:
        LINK.send_pending(self)

    def _close_after(self, server: ServerConnection | None, error: PgtarnError) -> None:
        LINK.close_after(self, server, error)

    def _to_server(self, data: bytes) -> None:
        LINK.to_server(self, data)

    def _send_item(self, item: PendingParts, size: int) -> None:
        LINK.send_item(self, item, size)

    def _start_statements(self) -> None:
        RELAY.start_statements(self)

    def _statements_ceded(self) -> None:
        RELAY.cede_statements(self)

    def _large_made(self, start: bytes, already: int) -> ClientLargeMessage:
        return ClientLargeMessage(self, start, self.runtime.config.max_packet_size, already)

    def _listen_made(self) -> ClientListen:
        listen = self.listen
        if listen is None:
            listen = self.listen = ClientListen(self)
        return listen

    def _tracking_made(self) -> SessionTracking:
        """Its session tracking, made now if it had none (here, which has all that the
        tracking asks of its connection: interfaces.TrackedClient)."""
        tracking = self.tracking
        if tracking is None:
            tracking = self.tracking = SessionTracking(self)
        return tracking

    def _session_made(self) -> SessionTracker:
        """The session state of a tracked client, made now if it had none."""
        return self._tracking_made().made()

    def _owe_answer(self, entry: list[Any]) -> None:
        """A LISTEN/UNLISTEN reply pgtarn owes (listening.py), after those owed before it."""
        self._listen_made().answers.append(entry)

    def _status_now(self) -> bytes:
        server = self.server
        if server is not None:
            return server.status
        route = self.route  # a BEGIN answered here (read_write_split): in a transaction
        return b"T" if route is not None and route.begin else b"I"

    def _session_ready(self, status: bytes) -> bool:
        """A ReadyForQuery while batches of the session are pending; False when the client
        was closed. The channels it committed go to its LISTEN state."""
        tracking = self.tracking
        assert tracking is not None
        if not tracking.ready(status):
            return False
        session = tracking.session
        assert session is not None
        committed = session.state.committed_subscriptions()
        if committed is not self.subscribed:
            listen = self.listen
            if listen is None:
                if not committed:  # none before, none now (and no state made for it)
                    return True
                listen = self._listen_made()
            listen.subscribe(committed)
        return True

    def _session_add(self, parsed: Parsed, replies_ahead: int, base: int) -> None:
        """A streamed text's effects (large.py), of the batch whose ReadyForQuery is
        replies_ahead + 1 from now."""
        self._tracking_made().add(parsed, replies_ahead, base)

    def _begin_large(self, large: ClientLargeMessage) -> None:
        """The relay left a message too long to hold (from the end of its chunk) to large."""
        rest = large.begin()
        if large.done:
            self.large = None
        if rest:  # (a message gathered whole, and what followed it)
            self.data_received(rest)

    # --- its session tracking's, read as its own (what a server and SHOW CLIENTS ask) -------

    def error_relayed(self) -> None:
        """The linked server relays an ErrorResponse: the batch under way failed."""
        tracking = self.tracking
        if tracking is not None:
            session = tracking.session
            if session is not None:
                session.error()

    def result_relayed(self, msg_type: int, body: bytes) -> None:
        """The linked server relays a DataRow or the end of a result (while rows are read)."""
        tracking = self.tracking
        if tracking is not None:
            session = tracking.session
            if session is not None:
                session.result(msg_type, body)

    def pin_reasons(self) -> list[str]:
        """Why this client keeps its server (SHOW CLIENTS)."""
        tracking = self.tracking
        return [] if tracking is None else tracking.pin_reasons()

    def tracked_settings(self) -> list[str]:
        tracking = self.tracking
        return [] if tracking is None else tracking.settings()

    # --- the login's end: the pool or the admin console, then the welcome --------------------

    def authenticated(self, scram_keys: tuple[bytes, bytes] | None, auth_ok: bytes) -> None:
        """The login's password exchange succeeded (LoginClient). auth_ok: the exchange's
        last message, ending in AuthenticationOk, not sent yet: it goes out with the welcome
        in one write (one system call fewer per login) when the pool knows its parameters
        already, else first and alone."""
        driver = self.login
        assert driver is not None
        login = driver.machine
        if self.db is None:
            if not driver.admin_login:  # as PgBouncer: told only to who authenticated
                driver.login_failed()
                raise PgtarnError(f"no such database: {self.database}", sqlstate="3D000")
            self.write(auth_ok)
            self._admin_ready(driver)
            return
        self.runtime.logins.discard(self)
        registry = self.runtime.registry
        name = self.db.name
        if name not in registry.databases and name not in self.runtime.config.databases:
            log.info("registered new auto-database: db=%s", name)
        # the registry holds servers as views; this pool's are ServerConnections
        pool = cast(Pool[ServerConnection], registry.get_pool(self.db, self.user))
        self.pool = pool
        pool.stats.client_logins += 1
        self.set_pool_mode(pool.pool_mode)
        if pool.split is not None and not self.session_mode:
            self.route = ClientRoute(pool.split, self.db.reads_only)
        if scram_keys is not None and self.db.user is None:
            pool.scram_keys = scram_keys
        disabled = self.database in self.runtime.registry.disabled
        # options settings that nothing would carry from server to server
        refused_options = bool(login.startup_settings) and (
            self.session_mode or not self.runtime.config.track_session_state
        )
        if disabled or self.replication or refused_options or pool.welcome is None:
            self._send_auth_ok(auth_ok)  # no welcome now
            auth_ok = b""
        if disabled:
            raise PgtarnError(f'database "{self.database}" is disabled', sqlstate="08P01")
        if self.replication:
            self.state = ClientState.WELCOME
            assert login.startup is not None
            request_replication(
                self.runtime, pool, self.db, self, login.startup.params, self.replication
            )  # when the pool has room (self.server)
            return
        if refused_options:
            _refuse_options(login)  # PgBouncer's refusal
        if pool.welcome is None:
            self.state = ClientState.WELCOME
            pool.wait_welcome(self)
        else:
            self.welcome_ready(auth_ok)

    def _welcome(
        self,
        login: ClientLogin,
        server_params: Mapping[str, str],
        tracked: Iterable[str],
        reported: Mapping[tuple[str, str], str] | None = None,
    ) -> bytes:
        """The welcome's bytes (its BackendKeyData: the key the client got at accept); this
        client's tracked parameters are set."""
        welcome = login.welcome(server_params, tracked, self.cancel_key, reported)
        self.login = None
        # shared with the clients that have the same values: replaced, never written
        self.params = self.runtime.shared_params(welcome.params)
        return self._notified(welcome.data)

    def _notified(self, data: bytes) -> bytes:
        """A welcome's bytes with login_notify_message, if set: a NOTICE just before the
        first ReadyForQuery."""
        message = login_settings(self.runtime.config).login_notify_message
        if message:
            notice = build.error_response("00000", message, "NOTICE", notice=True)
            return data[:-READY_FOR_QUERY_LEN] + notice + data[-READY_FOR_QUERY_LEN:]
        return data

    def _admin_ready(self, driver: ClientLoginDriver) -> None:
        """Logged in to the admin console: welcome, then commands."""
        login = driver.machine
        role = driver.admin_role()
        if role is None:
            # After authentication, so that the refusal says nothing about the password.
            raise PgtarnError("not allowed: not in admin_users or stats_users", sqlstate="28000")
        if login.startup_settings:
            _refuse_options(login)
        welcome = self._welcome(login, PARAMETERS, TRACKED)
        self.admin = AdminSession(self, self.runtime, role == "admin")
        self.state = ClientState.ADMIN
        self.runtime.logins.discard(self)
        self.runtime.admin_clients.add(self)
        if self.runtime.config.log_connections:
            log.info("%r admin console login (%s)", self, role)
        self.write(welcome)

    def welcome_ready(self, auth_ok: bytes = b"") -> None:
        """The pool knows the server's parameters: finish this client's login (auth_ok: the
        end of the authentication exchange, to send first, uncounted as before the pool)."""
        pool, driver = self.pool, self.login
        assert pool is not None and pool.welcome is not None and driver is not None
        login = driver.machine
        startup_settings = login.startup_settings
        runtime = self.runtime
        welcome = login.pool_welcome(
            runtime.welcomes,
            pool.welcome,
            tracked_names(runtime.config),
            self.cancel_key,
            runtime.reported_forms,
            runtime.shared_params,
        )
        self.login = None
        self.params = welcome.params  # (shared: see _welcome)
        self.state = ClientState.READY
        self.join_pool(pool)
        self.idle_since = monotonic()
        RELAY.start(self)
        if startup_settings:  # refused at authenticated unless the session is tracked
            self._tracking_made().start_with(startup_settings)
        self._send_auth_ok(auth_ok, self._notified(welcome.data))

    def _send_auth_ok(self, auth_ok: bytes, welcome: bytes = b"") -> None:
        """The end of the authentication exchange, uncounted in the pool's bytes (as before
        the login reached its pool), then the welcome, counted; in one write."""
        transport = self.transport
        if transport is not None and (auth_ok or welcome):
            transport.write(auth_ok + welcome)
            if welcome and self.pool is not None:
                self.pool.stats.sent += len(welcome)

    def replication_ready(self, server: ReplicationServer, leftover: bytes) -> None:
        """This replication client's own server logged in: welcome with its parameters,
        then every byte passes as it is, both ways, until either side leaves."""
        driver, pool = self.login, self.pool
        if self.state is not ClientState.WELCOME or driver is None or pool is None:
            server.release_from(self, False, None)
            return
        welcome = self._welcome(driver.machine, server.params, tracked_names(self.runtime.config))
        self.state = ClientState.REPLICATION
        server.client = self
        self.join_pool(pool)
        self.write(welcome + leftover)

    def cancel_request(self, key: tuple[int, int]) -> None:
        """Forward a CancelRequest (route_cancel); this connection ends when the cancel has."""
        self.leave_containers()  # all of it: connection_lost returns early for it, CLOSED
        self.state = ClientState.CLOSED
        self.send_state = SEND_NEVER
        assert self.transport is not None  # (it is what the request came on)
        route_cancel(self.runtime, key, self.transport.close)


def route_cancel(runtime: Runtime, key: tuple[int, int], done: Callable[[], None]) -> None:
    """A CancelRequest goes to the backend now running the query of the client with key: in
    this process, in another worker (byte 3 of the key, through the supervisor), in another
    pgtarn of [peers] (net/peers.py), or during a rolling restart in the old process. done
    is called when it is over there (at once when dropped, or sent on to the old process).

    Drivers take the close of their cancel connection as "the cancel is processed" and send
    their next query: closed before PostgreSQL got the cancel, that query would be the one
    cancelled. So the client's cancel connection closes at done: PostgreSQL closed the
    cancel's own connection, or the cancel was dropped or failed (cancel_wait_timeout)."""
    peer_id = runtime.config.peer_id
    coordinator = runtime.coordinator
    if cancel_by_key(runtime, key, done):
        pass  # one of ours
    elif coordinator is not None and (not peer_id or peer_of(key) == peer_id) and \
            coordinator.index != worker_of(key) < coordinator.count:  # fmt: skip
        runtime.spawn(_cancel_in_worker(runtime, coordinator, key, done))
    elif peer_id and peer_of(key) != peer_id:  # another peer's
        runtime.peers.forward(key, runtime.config, runtime.spawn, done)
    elif runtime.forward_cancel is not None:  # a client still on the old process (--reboot)
        runtime.forward_cancel(key)
        done()  # (no answer comes back: see docs/clients.md, "Cancel requests")
    elif peer_id:  # ours but unknown: dropped (and logged)
        runtime.peers.forward(key, runtime.config, runtime.spawn, done)
    else:
        done()


async def _cancel_in_worker(
    runtime: Runtime, coordinator: Coordinator, key: tuple[int, int], done: Callable[[], None]
) -> None:
    """workers = N: the worker the key names cancels (cancel_from_worker) and answers when
    its cancel is over; done then, or when no answer came in time."""
    config = runtime.config
    timeout = (config.cancel_wait_timeout or config.server_connect_timeout) + 1.0
    try:
        answer = await coordinator.ask_worker(
            worker_of(key), {"kind": "cancel", "key": list(key)}, timeout
        )
        if answer is None:
            log.warning("cancel request for worker %d: no answer in %g s", worker_of(key), timeout)
    finally:
        done()


def cancel_by_key(
    runtime: Runtime, key: tuple[int, int], done: Callable[[], None] | None = None
) -> bool:
    """Cancel the query of this process's client with key, if it has one running (a
    CancelRequest to its server's backend); whether the key is one of this process's. done
    is called when the cancel is over (at once when the client holds no server)."""
    # with peering on, a peer's forward comes with a lower TTL than the key handed out
    target = runtime.client_by_key(as_issued(key) if runtime.config.peer_id else key)
    if target is None:
        return False
    server = target.server
    if server is not None:
        server.send_cancel(target, done)
    elif done is not None:
        done()
    return True


def _refuse_options(login: ClientLogin) -> NoReturn:
    """The startup packet (options, or a parameter of its own) set something that is not a
    tracked parameter, and this client's session is not tracked: PgBouncer's refusal."""
    name = next(iter(login.startup_settings))
    where = "" if name in login.direct_settings else " in options"
    raise PgtarnError(f"unsupported startup parameter{where}: {name}", sqlstate="08P01")
