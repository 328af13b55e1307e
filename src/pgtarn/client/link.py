"""Linking a client to a server: lend, set differing parameters, end the link, release.

A part of the client connection that holds no field of its own: one ClientLink (LINK) serves
every client, and each method takes the client it links. What a link is (its server, the
ReadyForQuery owed, the bytes waiting for a server) stays in the client's fields, read and
written only here and by the relay; the server's side of it is ServerConnection.link and
its release (server/connection.py).
"""

from __future__ import annotations

import logging
import time
from typing import Final

from ..errors import PgtarnError
from ..net.sending import SEND_NEVER
from ..net.transport import CLOCK
from ..pool.pool import Pool
from ..proto import build
from ..proto.msgtypes import QUERY
from ..proto.parameters import has_rule
from ..server.connection import ServerConnection
from ..session.effects import Kind
from ..session.tracking import CLOSE_AFTER, NO_SETTINGS
from ..views.states import READY_STATE
from .parsers import load_readonly
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


class ClientLink:
    """Link and unlink: the pool lends a server, ReadyForQuery may end the loan, and a client
    that leaves hands its server back clean (or closes it mid-query).

    The client is a ClientTransport, a concrete class, not a typing.Protocol: in the
    compiled build its fields are then read as a C struct's."""

    __slots__ = ()

    def server_assigned(self, client: ClientTransport, server: ServerConnection) -> None:
        """The pool lends us a server: set differing parameters, then send what waited."""
        client.waiting = False
        client.wait_notified = False
        if client.state is not READY_STATE:
            assert client.pool is not None
            client.pool.release(server)
            return
        self.link(client, server)
        if client.pending:
            self._flush_pending(client, server)

    def _flush_pending(self, client: ClientTransport, server: ServerConnection) -> None:
        """Send what waited to the linked server; what a check of a statement holds back
        (ServerStatements.deferred) waits on, with what came after it."""
        pending = client.pending
        if len(pending) == 1 and isinstance(pending[0], bytes):
            data = pending[0]
            pending = NO_PENDING
        else:
            out = []
            rest: list[bytes | PendingParts] = NO_PENDING
            for at, item in enumerate(pending):
                out.append(self._encode(client, server, item))
                statements = server.statements
                if statements is not None and statements.deferred is not None:
                    rest = [(statements.deferred, None), *pending[at + 1 :]]
                    statements.deferred = None
                    break
            data = b"".join(out)
            pending = rest
        client.pending = pending  # (hold makes a new list anyway: an idle client keeps none)
        if not pending:
            if client.pending_size > PENDING_PAUSE and client.transport is not None:
                client.transport.resume_reading()
            client.pending_size = 0
        server.write(data)

    def statements_checked(self, client: ClientTransport) -> None:
        server = client.server
        if server is not None and client.pending and not client.waiting:
            self._flush_pending(client, server)

    def link(self, client: ClientTransport, server: ServerConnection) -> None:
        """Make server ours; it SETs the tracked parameters that differ on it."""
        client.server = server
        tracking = client.tracking  # (not the session property: the hot path)
        session = None if tracking is None else tracking.session
        if session is None:  # not tracked, or tracked with the state every client starts with
            server.link(client, client.params, NO_SETTINGS if client.tracked else None)
        else:
            state = session.state
            if state.restore:  # a RESET removed startup settings (options): set them again
                state.restore_startup()
            server.link(client, client.params, state.settings)
            if session.watching:  # a batch sent while the client waited reads its rows
                server.watch_rows(True)
        route = client.route
        if route is not None and route.begin:  # the BEGIN answered here, replies swallowed
            server.run_internal([route.begin], None)
            route.begin = ""

    def waiting_too_long(self, client: ClientTransport) -> None:
        if not client.wait_notified:
            client.wait_notified = True
            client.write(WAIT_NOTICE)

    def server_unavailable(self, client: ClientTransport, error: PgtarnError) -> None:
        client.waiting = False
        client.close(error)

    def parameter_changed(
        self, client: ClientTransport, name: str, value: str, hidden: bool
    ) -> None:
        """The linked server reported a new value (ParameterStatus): keep the client's own.
        One reported in the reply to pgtarn's SET of the client's value (hidden) differs from
        what the client was told only when PostgreSQL spells that value its own way: the
        client is told now, as PostgreSQL would have told it."""
        params = client.params
        if name in params and params[name] != value:
            if hidden:
                client.write(build.parameter_status(name, value))
                if not has_rule(name):  # the next welcome says it
                    forms = client.runtime.reported_forms
                    if len(forms) >= REPORTED_FORMS:
                        forms.clear()
                    forms[(name, params[name])] = value
            # a new dict, not a write: servers remember the dict they hold (server.link)
            client.params = {**params, name: value}

    def timed_out(self, client: ClientTransport, error: PgtarnError) -> None:
        """The janitor ends this client (a timeout): error, unless a reply is half sent."""
        self.close_after(client, client.server, error)

    def ready_for_query(
        self, client: ClientTransport, server: ServerConnection, status: bytes
    ) -> bytes | None:
        """Called by the linked server at each ReadyForQuery; may end the link.

        Returns None to forward the ReadyForQuery as is, or bytes to send in its place.
        """
        start = client.query_start
        now = 0.0  # (read once: the server's release below takes it too)
        idle = status == b"I"  # (compared once: a bytes comparison is a call when compiled)
        if start:
            # statistics: the query ends, and maybe its transaction
            pool = client.pool
            assert pool is not None
            stats = pool.stats
            now = CLOCK.now  # (the wake-up's reading: see LoopClock)
            if not now:
                now = monotonic()
            elapsed = now - start
            stats.query.observe(elapsed)
            if idle:
                began = client.xact_start
                if began:
                    elapsed = now - began
                    client.xact_start = 0.0
                stats.xact.observe(elapsed)
            elif not client.xact_start:
                client.xact_start = start
            # a pipelined query begins where the one before it ended
            client.query_start = now if client.expected > 1 else 0.0
            client.idle_since = now
        if client.expected > 0:
            client.expected -= 1
        tracking = client.tracking  # (not the session property: the hot path)
        session = None if tracking is None else tracking.session
        if session is not None and session.pending and not client._session_ready(status):
            return b""  # closed: its state may not be kept (pin_session_state = 0)
        if client.listening:  # LISTEN replies due, notifications (listening.py)
            listen = client.listen
            if listen is not None:
                return listen.ready_for_query(server, status)
            client.listening = False
        extras = client.extras
        if extras is not None and extras.schema_pending and idle:
            client.schema_change_ended()
        if client.expected:
            return None
        # link_ends's common cases, inlined: the hot path
        if not client.session_mode and idle:  # (statement mode: the same)
            if not client.pinned and not client.open_batch:
                self.unlink(client, server, now)
            return None
        return self.link_ends(client, server, status)

    def link_ends(
        self, client: ClientTransport, server: ServerConnection, status: bytes
    ) -> bytes | None:
        """Nothing more is owed: end the link if the mode says so (None: ReadyForQuery goes
        as it is; b"": the client was closed)."""
        if client.session_mode:
            return None
        if status == b"I":
            if not client.pinned and not client.open_batch:
                self.unlink(client, server)
            return None
        if client.statement_mode:
            # A transaction opened some other way (a function, a multi-statement query):
            # roll it back and end the client, as PgBouncer does.
            self.unlink(client, server)
            client.close(PgtarnError(TRANSACTION_REFUSED), TRANSACTION_REFUSED_RESPONSE)
            return b""
        return None

    def _routed_pool(self, client: ClientTransport) -> Pool[ServerConnection]:
        """read_write_split: the pool the transaction starting now takes its server from, as
        the client's route picks it."""
        route = client.route
        assert route is not None
        session = client.session
        return route.pool_for(
            session is not None
            and session.state.settings is not NO_SETTINGS
            and load_readonly()[1](session.state.settings)
        )

    def route_start(self, client: ClientTransport, data: bytes) -> bool:
        """read_write_split: a transaction may start with data; its first bytes say where it
        may run. A bare BEGIN is answered here (True), so that the statement after it can
        decide (SET TRANSACTION READ ONLY); it goes to that server ahead of it."""
        route = client.route
        assert route is not None
        if client.waiting or client.expected:
            return False
        kind = route.kind = load_readonly()[0](data, lambda name: _statement_text(client, name))
        if kind != Kind.BEGIN or route.begin or route.reads_only or client.statement_mode \
                or client.pinned or client.pending \
                or (client.listen is not None and (client.listen.withheld
                                                 or client.listen.held_batch)):  # fmt: skip
            return False
        route.begin = data[5:-1].decode("utf-8", "replace")
        if client.tracked:  # the session's state learns it as if PostgreSQL ran it
            client._tracking_made().text(QUERY, data[5:], 0)
            session = client.session
            if session is not None and session.pending:
                client._session_ready(b"T")
        client.query_start = 0.0
        client.idle_since = monotonic()
        client.write(BEGUN)
        return True

    def unlink(self, client: ClientTransport, server: ServerConnection, now: float = 0.0) -> None:
        """The link ends: the server goes back (now: the clock's reading, if taken)."""
        client.server = None
        route = client.route
        if route is not None:
            route.ended()
        tracking = client.tracking  # (not the session property: the hot path)
        session = None if tracking is None else tracking.session
        if session is not None and session.state.settings:
            # the same server next time, if it is idle then, needs no SET
            client.last_server = server
        server.reset_and_release(
            server.pool.reset_query_always,
            session.state.settings
            if session is not None
            else NO_SETTINGS
            if client.tracked
            else None,
            now,
        )

    def send_pending(self, client: ClientTransport) -> None:
        if not client.pending or client.waiting:
            return
        server = client.server
        if server is not None:  # a pinned client: its own server
            self._flush_pending(client, server)
            return
        client.waiting = True
        pool = client.pool if client.route is None else self._routed_pool(client)
        assert pool is not None
        server = pool.acquire(client, client.last_server)
        if server is not None:
            self.server_assigned(client, server)

    def server_lost(self, client: ClientTransport, server: ServerConnection) -> None:
        """Our linked server died: the client's transaction is gone; tell it and close."""
        client.server = None
        if server.fatal and server.at_boundary:
            # PostgreSQL's own FATAL reached the client (terminated, shut down): that is
            # the reason it sees, not followed by a second error of ours
            client.close_reason = f"server sent FATAL {server.fatal}"
            client.close()
            return
        self.close_after(
            client,
            server,
            PgtarnError(
                "server connection crashed or was terminated", sqlstate="08006", severity="FATAL"
            ),
        )

    def close_after(
        self, client: ClientTransport, server: ServerConnection | None, error: PgtarnError
    ) -> None:
        """Close with error, unless server's reply was relayed only in part: an ErrorResponse
        in the middle of a message would corrupt the stream, so then just close."""
        if server is not None and not server.at_boundary:
            client.close_reason = error.message
            client.send_state = SEND_NEVER
            if client.transport is not None:
                client.transport.abort()  # half a message sent: nothing more is worth flushing
            client.leave_containers()
            return
        client.close(error)

    def drop_server(self, client: ClientTransport) -> None:
        """The client is gone: never hand a server back mid-transaction."""
        server = client.server
        if server is None:
            return
        client.server = None
        config = client.runtime.config
        reset = (
            config.server_reset_query
            if client.session_mode or config.server_reset_query_always
            else None
        )
        session = client.session
        # part of a message may have gone: the server cannot take another client's bytes
        framer = client.framer
        mid = (
            client.expected > 0
            or client.large is not None
            or (not client.scanner.at_boundary if framer is None else framer.mid_message)
        )
        if session is None:  # (tracked: the settings every client starts with)
            server.release_from(client, mid, reset, NO_SETTINGS if client.tracked else None)
            return
        if session.watching:  # its next client's replies take the common case again
            server.watch_rows(False)
        state = session.state
        if client.pinned:
            # Its state must not reach the next client: DISCARD ALL clears it, unless some
            # of it outlives DISCARD ALL (LOAD, SET SEED, what was not followed).
            if not CLOSE_AFTER.isdisjoint(state.reasons()):
                server.release_from(
                    client, True, None, reason="its client left state that cannot be cleared"
                )
                return
            reset = "DISCARD ALL"
        server.release_from(client, mid, reset, state.committed_settings())

    def server_now(self, client: ClientTransport) -> ServerConnection | None:
        """The linked server, or an idle one linked now; None (and queued) otherwise."""
        server = client.server
        listen = client.listen
        if listen is not None and listen.withheld:  # a ReadyForQuery waits for the listener
            return None  # connection: so does this
        if server is None and not client.waiting:
            client.waiting = True
            pool = client.pool if client.route is None else self._routed_pool(client)
            assert pool is not None
            extras = client.extras  # (last_server, inlined: the hot path)
            # (query_start: when this callback began, if it brought the query; or earlier)
            server = pool.acquire(
                client, None if extras is None else extras.last_server, client.query_start
            )
            if server is not None:  # the common case: an idle server, no queue
                client.waiting = False
                self.link(client, server)
        return server

    def to_server(self, client: ClientTransport, data: bytes) -> None:
        server = self.server_now(client)
        if server is not None:
            server.write(data)
        else:
            self.hold(client, data, len(data))

    def send_item(self, client: ClientTransport, item: PendingParts, size: int) -> None:
        """Prepared-statement mode: encode for the linked server, or keep until one comes."""
        server = self.server_now(client)
        if server is None:
            self.hold(client, item, size)
            return
        statements = server.statements
        if client.pending or (statements is not None and statements.checking):
            self.hold(client, item, size)  # after what a check of a statement holds back
            return
        server.write(self._encode(client, server, item))
        statements = server.statements
        if statements is not None and statements.deferred is not None:
            self.hold(client, (statements.deferred, None), size)
            statements.deferred = None

    def hold(self, client: ClientTransport, item: bytes | PendingParts, size: int) -> None:
        """Keep what the client sent until server_assigned; pause a client that sends a lot."""
        if client.pending:
            client.pending.append(item)
        else:  # (never into the shared empty list)
            client.pending = [item]
        client.pending_size += size
        if client.pending_size > PENDING_PAUSE and client.transport is not None:
            client.transport.pause_reading()

    def _encode(
        self, client: ClientTransport, server: ServerConnection, item: bytes | PendingParts
    ) -> bytes:
        """Bytes for server from what the client sent (rewritten for its statements)."""
        if isinstance(item, bytes):
            return item
        assert client.statements is not None
        statements = server.prepared_statements()
        parts, chunk = item
        if parts is None:  # one whole Query (naming no statement, forgetting none)
            assert chunk is not None
            statements.sync_sent()
            return chunk
        data = statements.send(client.statements, parts, chunk, server.status)
        if statements.already_prepared:  # refused with 42P05: PgBouncer's log line
            for name in statements.already_prepared:
                log.error(
                    "%r prepared statement '%s' was already prepared",
                    client,
                    name.decode("utf-8", "replace"),
                )
                if client.tracked:
                    client._tracking_made().name_kept(name)
            statements.already_prepared.clear()
        server.start_hidden()  # a statement prepared ahead of a simple query
        if statements.describing:
            server.watch_descriptions()
        return data


#: The one link every client uses (it holds no field of any client).
LINK: Final = ClientLink()


def _statement_text(client: ClientTransport, name: bytes) -> bytes | None:
    """The text of the client's prepared statement name (None: unknown, or SQL-level)."""
    statements = client.statements
    stmt = statements.names.get(name) if statements is not None else None
    if stmt is None or stmt.sql:
        return None
    parse = stmt.parse  # Parse: type, length, server-side name, NUL, text, NUL, ...
    start = 5 + len(stmt.name) + 1
    end = parse.find(b"\x00", start)
    return parse[start:end] if end >= 0 else None
