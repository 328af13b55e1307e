"""The listener connection: one per pool, LISTENing to the channels its clients listen to.

pool/channels.py's ChannelBoard decides which channels are wanted; this file keeps a
connection to PostgreSQL that LISTENs to exactly those. Each LISTEN or UNLISTEN goes as its
own Query, so each ReadyForQuery confirms one, in order. Every NotificationResponse is
handed to the board as the whole message PostgreSQL sent (the notifying backend's PID kept).

The connection logs in as the pool's servers do (the pool's credentials, TLS, SCRAM
passthrough), named ``pgtarn listener``. It counts against max_db_connections and
max_user_connections, and waits for room when they are reached. When it is lost it is
opened again with the pool's retry backoff, and LISTENs to every wanted channel again; the
board warns the clients.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

from ..config.settings import DatabaseEntry
from ..errors import PgtarnError
from ..net.sockets import open_connection
from ..pool.channels import ChannelBoard
from ..pool.failing import retry_delay
from ..pool.pool import Pool
from ..proto import build
from ..proto.framing import MessageScanner
from ..proto.messages import parse_fields
from ..proto.msgtypes import LISTENER_TYPES, NOTIFICATION_RESPONSE, READY_FOR_QUERY
from ..runtime import Runtime
from .login import OwnConnection, server_login_for

log = logging.getLogger("pgtarn.listener")

APPLICATION_NAME = "pgtarn listener"


class Listener:
    """A pool's listener connection, across reconnects (the board's ListenerLink)."""

    __slots__ = (
        "board",
        "closed",
        "conn",
        "connected_at",
        "db",
        "failures",
        "id",
        "in_flight",
        "on_server",
        "pool",
        "retry_at",
        "runtime",
    )

    def __init__(
        self, runtime: Runtime, pool: Pool[Any], db: DatabaseEntry, board: ChannelBoard
    ) -> None:
        self.runtime = runtime
        self.pool = pool
        self.db = db
        self.board = board
        self.id = next(runtime.ids)
        #: The connection now (logging in or logged in); None between attempts.
        self.conn: _ListenerConnection | None = None
        #: Channels LISTENed to, or to be once the Queries in flight are answered.
        self.on_server: set[str] = set()
        #: (channel, LISTEN or UNLISTEN) of each Query sent and not yet answered, in order.
        self.in_flight: deque[tuple[str, bool]] = deque()
        self.failures = 0
        self.retry_at = 0.0
        self.connected_at = 0.0
        self.closed = False

    def __repr__(self) -> str:
        return f"L-{self.id}: {self.pool.database}/{self.pool.user}"

    # --- the board's commands -----------------------------------------------------------------

    def sync(self) -> None:
        conn = self.conn
        if conn is None:
            if time.monotonic() >= self.retry_at:
                self._connect()
            return
        if not conn.ready:
            return  # LISTENs to everything wanted once logged in
        wanted = self.board.wanted()
        queries = []
        for channel in sorted(self.on_server - wanted):
            queries.append(build.query(f"UNLISTEN {build.quote_ident(channel)}"))
            self.in_flight.append((channel, False))
        for channel in sorted(wanted - self.on_server):
            queries.append(build.query(f"LISTEN {build.quote_ident(channel)}"))
            self.in_flight.append((channel, True))
        if queries:
            self.on_server = wanted
            conn.write(b"".join(queries))

    def tick(self, now: float) -> None:
        conn = self.conn
        if self.closed:
            return
        if conn is None:
            if now >= self.retry_at:
                self._connect()
        elif not conn.ready and now - conn.created_at > self.pool.connect_timeout:
            conn.close("server_connect_timeout")
            self._failed(PgtarnError("server_connect_timeout"))

    def hold(self, held: bool) -> None:
        conn = self.conn
        if conn is not None and conn.transport is not None and conn.ready:
            if held:
                conn.transport.pause_reading()
            else:
                conn.transport.resume_reading()

    def restart(self, reason: str) -> None:
        conn = self.conn
        if conn is not None:
            log.info("%r closing because: %s (reconnecting)", self, reason)
            if conn.ready:
                self._lost(conn)
            self.conn = None
            conn.close(reason)
        self.retry_at = 0.0
        self._connect()

    def close(self, reason: str) -> None:
        self.closed = True
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close(reason)

    # --- connecting ---------------------------------------------------------------------------

    def _connect(self) -> None:
        if self.closed or self.conn is not None:
            return
        if not self.runtime.registry.may_open_listener(self.pool):
            # at max_db/user_connections: try again later
            self.retry_at = time.monotonic() + self._delay()
            return
        db = self.runtime.registry.server_entry(self.pool, self.db)
        self.db = db
        conn = self.conn = _ListenerConnection(self, db)
        runtime = self.runtime

        async def connect() -> None:
            config = runtime.config
            try:
                await open_connection(
                    db,
                    lambda: conn,
                    config.server_connect_timeout,
                    config.unix_socket_dir,
                    runtime.hosts,
                )
            except (TimeoutError, OSError) as exc:
                conn.lost(f"could not connect to server: {exc or 'timeout'}")

        runtime.spawn(connect())

    def _delay(self) -> float:
        return retry_delay(self.failures, self.pool.retry_cap)

    def _failed(self, error: PgtarnError) -> None:
        """A connection attempt failed: try again after the backoff delay."""
        self.conn = None
        self.failures += 1
        self.retry_at = time.monotonic() + self._delay()
        if self.runtime.config.log_pooler_errors:
            log.warning("%r %s", self, error.message)

    def _lost(self, conn: _ListenerConnection) -> None:
        """conn (logged in) is gone: the channels must be LISTENed to again."""
        if conn is not self.conn:
            return
        self.conn = None
        self.on_server = set()
        self.in_flight.clear()
        self.board.connection_lost()
        log.warning(
            "%r closing because: listener connection lost; clients listening are warned", self
        )

    # --- the connection's reports -----------------------------------------------------------

    def logged_in(self, conn: _ListenerConnection) -> None:
        if conn is not self.conn:
            return
        self.failures = 0
        self.connected_at = time.monotonic()
        if self.runtime.config.log_connections:
            log.info("%r new connection to server (listener)", self)
        self.board.connected()
        self.sync()
        if self.board.held:
            self.hold(True)

    def login_failed(self, conn: _ListenerConnection, error: PgtarnError) -> None:
        if conn is self.conn:
            self._failed(error)

    def connection_lost(self, conn: _ListenerConnection, reason: str) -> None:
        if conn is not self.conn:
            return
        if conn.ready:
            self._lost(conn)
            self.retry_at = time.monotonic() + self._delay()
            self.failures += 1
        else:
            self._failed(PgtarnError(reason))

    def replied(self, error: str) -> None:
        """A ReadyForQuery: the oldest LISTEN/UNLISTEN in flight is answered."""
        if not self.in_flight:
            return
        channel, listening = self.in_flight.popleft()
        if error:
            log.warning(
                "%r %s %s failed: %s",
                self,
                "LISTEN" if listening else "UNLISTEN",
                build.quote_ident(channel),
                error,
            )
            if listening:
                self.on_server.discard(channel)
                self.board.refused(channel, error)
                return
        self.board.confirmed(channel, listening)


class _ListenerConnection(OwnConnection):
    """One connection of a Listener: log in, then Queries out and replies in."""

    #: Its replies go on to the board and the clients as they are: nothing of theirs is caught.
    MESSAGES_CHECKED = False

    def __init__(self, listener: Listener, db: DatabaseEntry) -> None:
        runtime = listener.runtime
        super().__init__(
            runtime,
            server_login_for(runtime, listener.pool, db, APPLICATION_NAME),
            db.host,
            MessageScanner(LISTENER_TYPES, runtime.config.max_packet_size),
        )
        self.listener = listener
        self.error = ""
        self.created_at = time.monotonic()

    def _on_logged_in(self) -> None:
        self.listener.logged_in(self)

    def _login_failed(self, error: PgtarnError) -> None:
        self.login = None
        self.close(error.message)
        self.listener.login_failed(self, error)

    def _tls_failed(self, exc: Exception) -> None:
        self.login = None
        self.closed = True
        self.listener.login_failed(self, PgtarnError(f"could not connect to server: TLS: {exc}"))

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def _malformed(self, error: PgtarnError) -> None:
        self.close(error.message)

    def _message(self, msg_type: int, body: bytes) -> None:
        listener = self.listener
        if msg_type == NOTIFICATION_RESPONSE:  # pid, channel, payload
            channel_end = body.find(b"\x00", 4)
            channel = body[4:channel_end].decode("utf-8", "replace")
            listener.board.notification(channel, build.message(b"A", body))
        elif msg_type == READY_FOR_QUERY:
            failure, self.error = self.error, ""
            listener.replied(failure)
        else:  # ErrorResponse: of the LISTEN or UNLISTEN under way
            fields = parse_fields(body)
            self.error = f"{fields.get('C', '')} {fields.get('M', '')}"
            if fields.get("S") in ("FATAL", "PANIC"):
                log.warning("%r server sent FATAL %s", listener, self.error)

    def lost(self, reason: str) -> None:
        """The connect itself failed."""
        if not self.closed:
            self.closed = True
            self.listener.connection_lost(self, reason)

    def connection_lost(self, exc: Exception | None) -> None:
        was_closed = self.closed
        self.closed = True
        if not was_closed:
            self.listener.connection_lost(self, f"server closed the connection: {exc or ''}")

    def close(self, reason: str) -> None:
        if not self.closed:
            self._shut()
