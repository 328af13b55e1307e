"""Rolling restart (--reboot): a new pgtarn takes the listening sockets and idle clients.

The running pgtarn (workers = 1) listens on a Linux abstract unix socket named after its
listen_port (no file to place or clean; the peer's uid is checked with SO_PEERCRED). A new
pgtarn started with --reboot on the same port connects to it and, over a control channel
(workers/channel.py: JSON messages with descriptors):

1. asks for the listening sockets ("takeover") and gets them (SCM_RIGHTS): the same sockets,
   with their accept queues, so no connection attempt is refused at any moment;
2. serves them, then says so ("serving"): the old process stops accepting (it closes its
   own descriptors only; the sockets live on in the new one) and drains as SIGTERM does;
3. gets the old process's idle clients one by one ("client": the socket and its state,
   restart/handover.py) and goes on serving them, no login, no welcome, the same cancel key;
   clients in a transaction are sent as soon as their transaction ends; TLS, pinned, admin
   console and session-mode clients finish on the old process, which exits when they are
   gone;
4. forwards to the old process the CancelRequests for the clients still there ("cancel").
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from time import monotonic
from typing import Protocol, cast

from ..client.connection import ClientConnection
from ..client.relay import RELAY
from ..client.transport import NO_KEY
from ..net.accept import SocketServer
from ..net.accept import adopt as adopt_socket
from ..pool.pool import Pool
from ..runtime import Runtime
from ..server.connection import ServerConnection
from ..views.states import READY_STATE
from ..workers.channel import Channel, ChannelClosed
from ..workers.wire import Message
from .handover import (
    HandedClient,
    HandedStatement,
    HandoverError,
    decode_client,
    encode_client,
)

log = logging.getLogger("pgtarn")

#: How often the old process looks for clients that became idle (only while handing over).
SWEEP_INTERVAL = 0.005
#: How long either side waits for the other's answer.
REPLY_TIMEOUT = 10.0
_UCRED = struct.Struct("3i")


class Rebootable(Protocol):
    """What the old process's App offers to a takeover."""

    runtime: Runtime
    servers: list[SocketServer]
    unix_path: str | None

    def shutdown(self, mode: str, signalled: bool = False) -> None: ...

    def handed_over(self) -> None: ...


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a unix socket."""
    _pid, uid, _gid = _UCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    )
    return int(uid)


# --- the old process --------------------------------------------------------------------------


class Handover:
    """The old process's side of one takeover (see the module docstring)."""

    def __init__(
        self, app: Rebootable, conn: socket.socket, close_listener: Callable[[], None]
    ) -> None:
        self.app = app
        self.runtime = app.runtime
        self.close_listener = close_listener
        self.channel = Channel(conn, self._message, self._closed, name="takeover channel")
        self.sweeping: asyncio.TimerHandle | None = None
        #: Clients being sent now, and those the new process refused (they stay here).
        self.sending: set[ClientConnection] = set()
        self.kept: set[ClientConnection] = set()
        self.handed = 0

    def _message(self, channel: Channel, message: Message, fds: list[int]) -> None:
        kind = message.get("kind")
        if kind == "takeover":
            socks = [sock for server in self.app.servers for sock in server.sockets]
            log.info(
                "takeover: pid %s asks for the listening sockets; sending %d",
                message.get("pid"),
                len(socks),
            )
            channel.reply(
                message,
                {"unix_path": self.app.unix_path, "pid": os.getpid()},
                [sock.fileno() for sock in socks],
            )
        elif kind == "serving":
            reasons = [
                idle_reason(cast(ClientConnection, c)) for c in self.runtime.clients.values()
            ]
            moving = ("", "transaction", "busy")
            log.info(
                "takeover: the new process serves; no new connections here; of %d "
                "clients %d are idle and go to it now, %d are in a transaction and %d "
                "in a query or waiting for a server (they go when it ends), %d stay "
                "here",
                len(reasons),
                reasons.count(""),
                reasons.count("transaction"),
                reasons.count("busy"),
                sum(r not in moving for r in reasons),
            )
            self.close_listener()
            self.app.unix_path = None  # the socket file is the new process's now
            self.app.handed_over()
            self.app.shutdown("clients")
            channel.reply(message, {})
            self._sweep()
        elif kind == "cancel":
            key = message.get("key")
            if (
                isinstance(key, list)
                and len(key) == 2
                and all(isinstance(part, int) for part in key)
            ):
                target = self.runtime.client_by_key((key[0], key[1]))
                if target is not None and target.server is not None:
                    target.server.send_cancel(target)
        elif "id" in message:
            channel.reply(message, {"error": f"unknown message {kind!r}"})

    def _sweep(self) -> None:
        """Send every client that is idle now; look again soon while any are left."""
        self.sweeping = None
        if self.channel.closed:
            return
        for view in list(self.runtime.clients.values()):
            client = cast(ClientConnection, view)
            if client in self.sending or client in self.kept or idle_reason(client):
                continue
            self._send(client)
        if self.runtime.clients:
            self.sweeping = asyncio.get_running_loop().call_later(SWEEP_INTERVAL, self._sweep)

    def _send(self, client: ClientConnection) -> None:
        transport = client.transport
        assert transport is not None
        sock = transport.get_extra_info("socket")
        if sock is None:
            self.kept.add(client)
            return
        # from here on its bytes wait in the socket, for whichever process reads it next
        transport.pause_reading()
        self.sending.add(client)
        self.runtime.spawn(self._hand(client, sock.fileno()))

    async def _hand(self, client: ClientConnection, fd: int) -> None:
        try:
            reply, _fds = await self.channel.request(
                {"kind": "client", "client": encode_client(client_state(client))},
                REPLY_TIMEOUT,
                [fd],
            )
        except ChannelClosed:  # the new process is gone, and the socket with it if it had it
            reply = {"error": "the new process is gone"}
        except TimeoutError:
            # it may take the client yet: two processes must never read one client
            self.sending.discard(client)
            client.close_reason = "the new process did not answer its handover in time"
            if client.transport is not None:
                client.transport.abort()
            return
        self.sending.discard(client)
        transport = client.transport
        if reply.get("error") or transport is None or transport.is_closing():
            self.kept.add(client)
            log.info("%r stays on this process: %s", client, reply.get("error", "closed"))
            if transport is not None and not transport.is_closing():
                transport.resume_reading()
            return
        self.handed += 1
        # the new process has the socket: ours closes quietly (the connection lives on)
        client.close_reason = "handed over to the new process"
        transport.abort()

    def _closed(self, channel: Channel) -> None:
        if self.sweeping is not None:
            self.sweeping.cancel()
            self.sweeping = None

    def finish(self) -> None:
        """This process exits."""
        log.info(
            "takeover: %d clients handed over, %d refused by the new process",
            self.handed,
            len(self.kept),
        )
        self.channel.close()


def idle_reason(client: ClientConnection) -> str:
    """Why client cannot be handed over now ("": it can; "transaction": it is in one;
    "busy": a query under way or waiting for a server, or bytes half read or unsent)."""
    if client.state is not READY_STATE:
        return "not a logged-in pooled client"
    if client.pool_mode == "session":
        return "session mode"
    if client.tls is not None:
        return "TLS"
    if client.pinned:
        return "pinned"
    server = client.server
    if server is not None and server.status != b"I":
        return "transaction"
    if (
        server is not None
        or client.waiting
        or client.pending
        or client.expected
        or not client.scanner.at_boundary
        or (client.framer is not None and not client.framer.idle)
        or client.listening
        or (client.listen is not None and client.listen.holds_anything())
        or (client.framer is not None and client.framer.named_effects)
        or client.write_paused
    ):
        return "busy"
    transport = client.transport
    if transport is None or transport.is_closing() or transport.get_write_buffer_size():
        return "busy"
    session = client.session
    if session is not None:
        state = session.state
        if session.pending or state.base is not None or state.local:
            return "busy"
        if client.pinned or state.reasons() or state.subscriptions or state.channels:
            return "pinned"
    return ""


def client_state(client: ClientConnection) -> HandedClient:
    """What the new process needs to go on serving client."""
    settings: dict[str, str] = {}
    startup: dict[str, str] = {}
    restore = False
    if client.session is not None:
        state = client.session.state
        settings, startup, restore = dict(state.settings), dict(state.startup), state.restore
    statements = []
    if client.statements is not None:
        for name, stmt in client.statements.names.items():
            if stmt.sql:  # the Query "PREPARE <server name><definition>"
                definition = stmt.parse[5 + len(b"PREPARE ") + len(stmt.name) : -1]
            else:  # the Parse "<server name>\0<query>\0<types>"
                definition = stmt.parse[5 + len(stmt.name) + 1 :]
            statements.append(HandedStatement(name, definition, stmt.sql))
    pool = client.pool
    return HandedClient(
        user=client.user,
        database=client.database,
        cancel_key=client.cancel_key,
        params=dict(client.params),
        connect_time=client.connect_time,
        age=monotonic() - client.created_at,
        settings=settings,
        startup_settings=startup,
        restore=restore,
        framer=client.framer is not None,
        statements=statements,
        scram_keys=pool.scram_keys if pool is not None else None,
    )


# --- the new process --------------------------------------------------------------------------


async def ask_for_sockets(channel: Channel) -> tuple[list[socket.socket], str | None, int]:
    """A takeover's first step, from the new side: the old pgtarn's listening sockets, its
    unix socket's path and its pid. ConnectionError (the channel closed) if it refuses."""
    try:
        reply, fds = await channel.request({"kind": "takeover", "pid": os.getpid()}, REPLY_TIMEOUT)
    except (ChannelClosed, TimeoutError):
        channel.close()
        raise ConnectionError(
            "the running pgtarn refused the takeover (it is stopping, or "
            "handing over to another one)"
        ) from None
    pid = reply.get("pid")
    path = reply.get("unix_path")
    socks = [socket.socket(fileno=fd) for fd in fds]
    old_pid = pid if isinstance(pid, int) else 0
    log.info("takeover: %d listening sockets from pid %d", len(socks), old_pid)
    return socks, path if isinstance(path, str) else None, old_pid


def log_done(old_pid: int, adopted: int) -> None:
    """The new side's last word on a takeover: the old process closed the channel."""
    log.info(
        "takeover: the old process (pid %d) is done; %d clients came from it", old_pid, adopted
    )


class Takeover:
    """The new process's side: the listening sockets, then clients (module docstring)."""

    def __init__(self, runtime: Runtime, sock: socket.socket) -> None:
        self.runtime = runtime
        self.channel = Channel(sock, self._message, self._closed, name="takeover channel")
        self.adopted = 0
        self.old_pid = 0

    async def listening_sockets(self) -> tuple[list[socket.socket], str | None]:
        """The old process's listening sockets, and its unix socket's path."""
        socks, path, self.old_pid = await ask_for_sockets(self.channel)
        return socks, path

    async def serving(self) -> None:
        """We accept on the sockets: the old process stops."""
        await self.channel.request({"kind": "serving"}, REPLY_TIMEOUT)
        self.runtime.forward_cancel = self._forward_cancel

    def _forward_cancel(self, key: tuple[int, int]) -> None:
        if not self.channel.closed:
            self.channel.send({"kind": "cancel", "key": list(key)})

    def _message(self, channel: Channel, message: Message, fds: list[int]) -> None:
        if message.get("kind") != "client" or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            if "id" in message:
                channel.reply(message, {"error": "unknown message"})
            return
        sock = socket.socket(fileno=fds[0])
        self.runtime.spawn(self._adopt(message, sock))

    async def _adopt(self, message: Message, sock: socket.socket) -> None:
        reply = await adopt_message(self.runtime, message, sock)
        if not reply:
            self.adopted += 1
        if not self.channel.closed:
            self.channel.reply(message, reply)

    def finish(self) -> None:
        """This process exits (before the old one: it no longer waits for us)."""
        self.channel.close()

    def _closed(self, channel: Channel) -> None:
        self.runtime.forward_cancel = None
        log_done(self.old_pid, self.adopted)


async def take_over(
    runtime: Runtime, address: str, serve: Callable[[socket.socket], Awaitable[None]]
) -> tuple[Takeover, str | None] | None:
    """Take the listening sockets of the pgtarn at address and serve them (serve: one
    socket); then it stops and sends its clients. Returns the takeover and the unix
    socket's path; None: no pgtarn listens there."""
    sock = await connect(address)
    if sock is None:
        return None
    takeover = Takeover(runtime, sock)
    socks, path = await takeover.listening_sockets()
    for listening in socks:
        await serve(listening)
    await takeover.serving()
    return takeover, path


async def connect(address: str) -> socket.socket | None:
    """The takeover socket of the pgtarn at address (None: none listens there)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(sock, address)
        if peer_uid(sock) != os.getuid():
            raise PermissionError("the process on the takeover socket is another user's")
    except (ConnectionRefusedError, FileNotFoundError):
        sock.close()
        return None
    except OSError:
        sock.close()
        raise
    return sock


async def adopt_message(runtime: Runtime, message: Message, sock: socket.socket) -> Message:
    """Serve the client a "client" message describes, on sock; the reply to the old side
    ({}, or why the client stays there)."""
    try:
        state = decode_client(message.get("client") or {})
        await adopt(runtime, state, sock)
    except (HandoverError, OSError) as exc:
        sock.close()  # ours only: the old process keeps the client
        return {"error": str(exc)}
    return {}


async def adopted_by_worker(runtime: Runtime, message: Message, fds: list[int]) -> Message:
    """A worker's "adopt": a client its supervisor passes on from the old pgtarn."""
    if len(fds) != 1:
        for fd in fds:
            os.close(fd)
        return {"error": "no socket came with the client"}
    return await adopt_message(runtime, message, socket.socket(fileno=fds[0]))


async def adopt(runtime: Runtime, state: HandedClient, sock: socket.socket) -> None:
    """Serve a handed-over client from where it was (HandoverError: it cannot be here)."""
    db = runtime.config.find_database(state.database)
    if db is None:
        raise HandoverError(f"no database {state.database} here")
    if state.cancel_key == NO_KEY or runtime.key_taken(state.cancel_key):
        raise HandoverError("its cancel key is in use here")
    pool = cast(Pool[ServerConnection], runtime.registry.get_pool(db, state.user))
    if pool.pool_mode == "session":
        raise HandoverError("session mode here")
    if state.scram_keys is not None and pool.scram_keys is None and db.user is None:
        # SCRAM passthrough: its next server logs in with the keys of the client's login
        pool.scram_keys = state.scram_keys
    client = ClientConnection(runtime)
    client.login = None
    client.user, client.database, client.db = state.user, state.database, db
    client.pool = pool
    client.set_pool_mode(pool.pool_mode)
    client.params = dict(state.params)
    client.cancel_key = state.cancel_key
    client.created_at = monotonic() - state.age
    RELAY.start(client)
    if not client.tracked and (state.settings or state.startup_settings):
        raise HandoverError("session state is not tracked here")
    if not client.follows_statements and state.statements:
        raise HandoverError("prepared statements are not followed here")
    if client.tracked and (state.settings or state.startup_settings or state.restore):
        session = client._session_made()
        session.state.startup = state.startup_settings or session.state.startup
        session.state.settings = state.settings or session.state.settings
        session.state.restore = state.restore
    if state.statements:
        statements = RELAY.statements_made(client)
        for handed in state.statements:
            if handed.sql:
                statements.name(
                    handed.name, runtime.statement_cache.sql_statement(handed.definition)
                )
            else:
                statements.define(handed.name, handed.definition)
    if state.framer and client.follows_statements:
        RELAY.start_statements(client)
    client.state = READY_STATE
    try:
        adopt_socket(asyncio.get_running_loop(), sock, client)
    except BaseException:
        if client.statements is not None:
            client.statements.clear()
        raise
    runtime.logins.discard(client)
    client.join_pool(pool)
    client.idle_since = monotonic()
