"""Linking a client to a server: lend, set differing parameters, end the link, release."""

from __future__ import annotations

import logging
import time
from typing import Any, Final

from ..errors import PgtarnError
from ..net.sending import SEND_NEVER
from ..pool.pool import Pool
from ..proto import build
from ..proto.msgtypes import QUERY
from ..proto.parameters import has_rule
from ..server.connection import ServerConnection
from ..session.effects import Kind, Parsed
from ..session.tracking import CLOSE_AFTER, NO_SETTINGS, SessionTracker
from ..views.states import READY_STATE
from .listening import ClientListen
from .parsers import load_readonly
from .tracking import SessionTracking
from .transport import NO_PENDING, ClientTransport, PendingParts

log = logging.getLogger("pgtarn.client")

#: A static in the compiled build (a module global costs a dictionary lookup per call).
monotonic: Final = time.monotonic

#: Statement mode ends a client that opens a transaction block: PgBouncer's words and
#: SQLSTATE (08P01: drivers see the connection lost, which it is), with a hint of ours.
TRANSACTION_REFUSED: Final = "transaction blocks not allowed in statement pooling mode"
TRANSACTION_REFUSED_RESPONSE: Final = build.error_response(
    "08P01",
    TRANSACTION_REFUSED,
    "FATAL",
    hint="use pool_mode=transaction or session for this database or user",
)

#: At most this many reported forms of startup values are kept (Runtime.reported_forms).
REPORTED_FORMS: Final = 256
#: Bytes held for a server that is not there yet past which the client is not read.
PENDING_PAUSE: Final = 256 * 1024
#: The replies to a BEGIN answered here (read_write_split).
BEGUN: Final = build.command_complete("BEGIN") + build.ready_for_query(b"T")
WAIT_NOTICE: Final = build.error_response(  # PgBouncer's words: alerting matches them
    "00000",
    "No server connection available in postgres backend, client being queued",
    "NOTICE",
    hint="the pool size (pool_size, max_db_connections) limits the servers",
    notice=True,
)


class ClientLink(ClientTransport):
    """Link and unlink: the pool lends a server, ReadyForQuery may end the loan, and a client
    that leaves hands its server back clean (or closes it mid-query)."""

    __slots__ = ()

    def server_assigned(self, server: ServerConnection) -> None:
        """The pool lends us a server: set differing parameters, then send what waited."""
        self.waiting = False
        self.wait_notified = False
        if self.state is not READY_STATE:
            assert self.pool is not None
            self.pool.release(server)
            return
        self._link(server)
        if self.pending:
            self._flush_pending(server)

    def _flush_pending(self, server: ServerConnection) -> None:
        """Send what waited to the linked server; what a check of a statement holds back
        (ServerStatements.deferred) waits on, with what came after it."""
        pending = self.pending
        if len(pending) == 1 and isinstance(pending[0], bytes):
            data = pending[0]
            pending = NO_PENDING
        else:
            out = []
            rest: list[bytes | PendingParts] = NO_PENDING
            for at, item in enumerate(pending):
                out.append(self._encode(server, item))
                statements = server.statements
                if statements is not None and statements.deferred is not None:
                    rest = [(statements.deferred, None), *pending[at + 1 :]]
                    statements.deferred = None
                    break
            data = b"".join(out)
            pending = rest
        self.pending = pending  # (_hold makes a new list anyway: an idle client keeps none)
        if not pending:
            if self.pending_size > PENDING_PAUSE and self.transport is not None:
                self.transport.resume_reading()
            self.pending_size = 0
        server.write(data)

    def statements_checked(self) -> None:
        server = self.server
        if server is not None and self.pending and not self.waiting:
            self._flush_pending(server)

    def _link(self, server: ServerConnection) -> None:
        """Make server ours; it SETs the tracked parameters that differ on it."""
        self.server = server
        tracking = self.tracking  # (not the session property: the hot path)
        session = None if tracking is None else tracking.session
        if session is None:  # not tracked, or tracked with the state every client starts with
            server.link(self, self.params, NO_SETTINGS if self.tracked else None)
        else:
            state = session.state
            if state.restore:  # a RESET removed startup settings (options): set them again
                state.restore_startup()
            server.link(self, self.params, state.settings)
            if session.watching:  # a batch sent while the client waited reads its rows
                server.watch_rows(True)
        route = self.route
        if route is not None and route.begin:  # the BEGIN answered here, replies swallowed
            server.run_internal([route.begin], None)
            route.begin = ""

    def waiting_too_long(self) -> None:
        if not self.wait_notified:
            self.wait_notified = True
            self.write(WAIT_NOTICE)

    def server_unavailable(self, error: PgtarnError) -> None:
        self.waiting = False
        self.close(error)

    def parameter_changed(self, name: str, value: str, hidden: bool) -> None:
        """The linked server reported a new value (ParameterStatus): keep the client's own.
        One reported in the reply to pgtarn's SET of the client's value (hidden) differs from
        what the client was told only when PostgreSQL spells that value its own way: the
        client is told now, as PostgreSQL would have told it."""
        params = self.params
        if name in params and params[name] != value:
            if hidden:
                self.write(build.parameter_status(name, value))
                if not has_rule(name):  # the next welcome says it
                    forms = self.runtime.reported_forms
                    if len(forms) >= REPORTED_FORMS:
                        forms.clear()
                    forms[(name, params[name])] = value
            # a new dict, not a write: servers remember the dict they hold (server.link)
            self.params = {**params, name: value}

    def timed_out(self, error: PgtarnError) -> None:
        """The janitor ends this client (a timeout): error, unless a reply is half sent."""
        self._close_after(self.server, error)

    def ready_for_query(self, server: ServerConnection, status: bytes) -> bytes | None:
        """Called by the linked server at each ReadyForQuery; may end the link.

        Returns None to forward the ReadyForQuery as is, or bytes to send in its place.
        """
        start = self.query_start
        now = 0.0  # (read once: the server's release below takes it too)
        if start:
            # statistics: the query ends, and maybe its transaction
            pool = self.pool
            assert pool is not None
            stats = pool.stats
            now = monotonic()
            elapsed = now - start
            stats.query.observe(elapsed)
            if status == b"I":
                began = self.xact_start
                if began:
                    elapsed = now - began
                    self.xact_start = 0.0
                stats.xact.observe(elapsed)
            elif not self.xact_start:
                self.xact_start = start
            # a pipelined query begins where the one before it ended
            self.query_start = now if self.expected > 1 else 0.0
            self.idle_since = now
        if self.expected > 0:
            self.expected -= 1
        tracking = self.tracking  # (not the session property: the hot path)
        session = None if tracking is None else tracking.session
        if session is not None and session.pending and not self._session_ready(status):
            return b""  # closed: its state may not be kept (pin_session_state = 0)
        if self.listening:  # LISTEN replies due, notifications (listening.py)
            listen = self.listen
            if listen is not None:
                return listen.ready_for_query(server, status)
            self.listening = False
        extras = self.extras
        if extras is not None and extras.schema_pending and status == b"I":
            self.schema_change_ended()
        if self.expected:
            return None
        # _link_ends's common cases, inlined: the hot path
        if not self.session_mode and status == b"I":  # (statement mode: the same)
            if not self.pinned and not self.open_batch:
                self._unlink(server, now)
            return None
        return self._link_ends(server, status)

    # --- the LISTEN state (listening.py), a part of its own --------------------------------------

    def _listen_made(self) -> ClientListen:
        listen = self.listen
        if listen is None:
            listen = self.listen = ClientListen(self)
        return listen

    # --- the session tracking (tracking.py), a part of its own -----------------------------------

    def _tracking_made(self) -> SessionTracking:
        """Its session tracking, made now if it had none (here, by ClientLink, which has all
        that the tracking asks of its connection: interfaces.TrackedClient)."""
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

    def _link_ends(self, server: ServerConnection, status: bytes) -> bytes | None:
        """Nothing more is owed: end the link if the mode says so (None: ReadyForQuery goes
        as it is; b"": the client was closed)."""
        if self.session_mode:
            return None
        if status == b"I":
            if not self.pinned and not self.open_batch:
                self._unlink(server)
            return None
        if self.statement_mode:
            # A transaction opened some other way (a function, a multi-statement query):
            # roll it back and end the client, as PgBouncer does.
            self._unlink(server)
            self.close(PgtarnError(TRANSACTION_REFUSED), TRANSACTION_REFUSED_RESPONSE)
            return b""
        return None

    def _routed_pool(self) -> Pool[ServerConnection]:
        """read_write_split: the pool the transaction starting now takes its server from, as
        the client's route picks it."""
        route = self.route
        assert route is not None
        session = self.session
        return route.pool_for(
            session is not None
            and session.state.settings is not NO_SETTINGS
            and load_readonly()[1](session.state.settings)
        )

    def _route_start(self, data: bytes) -> bool:
        """read_write_split: a transaction may start with data; its first bytes say where it
        may run. A bare BEGIN is answered here (True), so that the statement after it can
        decide (SET TRANSACTION READ ONLY); it goes to that server ahead of it."""
        route = self.route
        assert route is not None
        if self.waiting or self.expected:
            return False
        kind = route.kind = load_readonly()[0](data, self._statement_text)
        if kind != Kind.BEGIN or route.begin or route.reads_only or self.statement_mode \
                or self.pinned or self.pending \
                or (self.listen is not None and (self.listen.withheld
                                                 or self.listen.held_batch)):  # fmt: skip
            return False
        route.begin = data[5:-1].decode("utf-8", "replace")
        if self.tracked:  # the session's state learns it as if PostgreSQL ran it
            self._tracking_made().text(QUERY, data[5:], 0)
            session = self.session
            if session is not None and session.pending:
                self._session_ready(b"T")
        self.query_start = 0.0
        self.idle_since = monotonic()
        self.write(BEGUN)
        return True

    def _statement_text(self, name: bytes) -> bytes | None:
        """The text of the client's prepared statement name (None: unknown, or SQL-level)."""
        statements = self.statements
        stmt = statements.names.get(name) if statements is not None else None
        if stmt is None or stmt.sql:
            return None
        parse = stmt.parse  # Parse: type, length, server-side name, NUL, text, NUL, ...
        start = 5 + len(stmt.name) + 1
        end = parse.find(b"\x00", start)
        return parse[start:end] if end >= 0 else None

    def _unlink(self, server: ServerConnection, now: float = 0.0) -> None:
        """The link ends: the server goes back (now: the clock's reading, if taken)."""
        self.server = None
        route = self.route
        if route is not None:
            route.ended()
        tracking = self.tracking  # (not the session property: the hot path)
        session = None if tracking is None else tracking.session
        if session is not None and session.state.settings:
            # the same server next time, if it is idle then, needs no SET
            self.last_server = server
        server.reset_and_release(
            server.pool.reset_query_always,
            session.state.settings
            if session is not None
            else NO_SETTINGS
            if self.tracked
            else None,
            now,
        )

    def _send_pending(self) -> None:
        if not self.pending or self.waiting:
            return
        server = self.server
        if server is not None:  # a pinned client: its own server
            self._flush_pending(server)
            return
        self.waiting = True
        pool = self.pool if self.route is None else self._routed_pool()
        assert pool is not None
        server = pool.acquire(self, self.last_server)
        if server is not None:
            self.server_assigned(server)

    def server_lost(self, server: ServerConnection) -> None:
        """Our linked server died: the client's transaction is gone; tell it and close."""
        self.server = None
        if server.fatal and server.scanner.at_boundary:
            # PostgreSQL's own FATAL reached the client (terminated, shut down): that is
            # the reason it sees, not followed by a second error of ours
            self.close_reason = f"server sent FATAL {server.fatal}"
            self.close()
            return
        self._close_after(
            server,
            PgtarnError(
                "server connection crashed or was terminated", sqlstate="08006", severity="FATAL"
            ),
        )

    def _close_after(self, server: ServerConnection | None, error: PgtarnError) -> None:
        """Close with error, unless server's reply was relayed only in part: an ErrorResponse
        in the middle of a message would corrupt the stream, so then just close."""
        if server is not None and not server.scanner.at_boundary:
            self.close_reason = error.message
            self.send_state = SEND_NEVER
            if self.transport is not None:
                self.transport.abort()  # half a message sent: nothing more is worth flushing
            self.leave_containers()
            return
        self.close(error)

    def _drop_server(self) -> None:
        """The client is gone: never hand a server back mid-transaction."""
        server = self.server
        if server is None:
            return
        self.server = None
        config = self.runtime.config
        reset = (
            config.server_reset_query
            if self.session_mode or config.server_reset_query_always
            else None
        )
        session = self.session
        # part of a message may have gone: the server cannot take another client's bytes
        framer = self.framer
        mid = (
            self.expected > 0
            or self.large is not None
            or (not self.scanner.at_boundary if framer is None else framer.mid_message)
        )
        if session is None:  # (tracked: the settings every client starts with)
            server.release_from(self, mid, reset, NO_SETTINGS if self.tracked else None)
            return
        if session.watching:  # its next client's replies take the common case again
            server.watch_rows(False)
        state = session.state
        if self.pinned:
            # Its state must not reach the next client: DISCARD ALL clears it, unless some
            # of it outlives DISCARD ALL (LOAD, SET SEED, what was not followed).
            if not CLOSE_AFTER.isdisjoint(state.reasons()):
                server.release_from(
                    self, True, None, reason="its client left state that cannot be cleared"
                )
                return
            reset = "DISCARD ALL"
        server.release_from(self, mid, reset, state.committed_settings())

    def _server_now(self) -> ServerConnection | None:
        """The linked server, or an idle one linked now; None (and queued) otherwise."""
        server = self.server
        listen = self.listen
        if listen is not None and listen.withheld:  # a ReadyForQuery waits for the listener
            return None  # connection: so does this
        if server is None and not self.waiting:
            self.waiting = True
            pool = self.pool if self.route is None else self._routed_pool()
            assert pool is not None
            extras = self.extras  # (last_server, inlined: the hot path)
            # (query_start: when this callback began, if it brought the query; or earlier)
            server = pool.acquire(
                self, None if extras is None else extras.last_server, self.query_start
            )
            if server is not None:  # the common case: an idle server, no queue
                self.waiting = False
                self._link(server)
        return server

    def _session_add(self, parsed: Parsed, replies_ahead: int, base: int) -> None:
        """A streamed text's effects (large.py), of the batch whose ReadyForQuery is
        replies_ahead + 1 from now."""
        self._tracking_made().add(parsed, replies_ahead, base)

    def _to_server(self, data: bytes) -> None:
        server = self._server_now()
        if server is not None:
            server.write(data)
        else:
            self._hold(data, len(data))

    def _send_item(self, item: PendingParts, size: int) -> None:
        """Prepared-statement mode: encode for the linked server, or keep until one comes."""
        server = self._server_now()
        if server is None:
            self._hold(item, size)
            return
        statements = server.statements
        if self.pending or (statements is not None and statements.checking):
            self._hold(item, size)  # after what a check of a statement holds back
            return
        server.write(self._encode(server, item))
        statements = server.statements
        if statements is not None and statements.deferred is not None:
            self._hold((statements.deferred, None), size)
            statements.deferred = None

    def _start_statements(self) -> None:
        """The client uses the extended protocol: its statements are followed from now on
        (the relay's, relay.py; ClientConnection has it)."""
        raise NotImplementedError

    def _hold(self, item: bytes | PendingParts, size: int) -> None:
        """Keep what the client sent until server_assigned; pause a client that sends a lot."""
        if self.pending:
            self.pending.append(item)
        else:  # (never into the shared empty list)
            self.pending = [item]
        self.pending_size += size
        if self.pending_size > PENDING_PAUSE and self.transport is not None:
            self.transport.pause_reading()

    def _encode(self, server: ServerConnection, item: bytes | PendingParts) -> bytes:
        """Bytes for server from what the client sent (rewritten for its statements)."""
        if isinstance(item, bytes):
            return item
        assert self.statements is not None
        statements = server.prepared_statements()
        parts, chunk = item
        if parts is None:  # one whole Query (naming no statement, forgetting none)
            assert chunk is not None
            statements.sync_sent()
            return chunk
        data = statements.send(self.statements, parts, chunk, server.status)
        if statements.already_prepared:  # refused with 42P05: PgBouncer's log line
            for name in statements.already_prepared:
                log.error(
                    "%r prepared statement '%s' was already prepared",
                    self,
                    name.decode("utf-8", "replace"),
                )
                if self.tracked:
                    self._tracking_made().name_kept(name)
            statements.already_prepared.clear()
        server.start_hidden()  # a statement prepared ahead of a simple query
        if statements.describing:
            server.watch_descriptions()
        return data
