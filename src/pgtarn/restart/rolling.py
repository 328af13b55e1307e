"""Rolling restart (--reboot) with workers = N: the supervisor's side of a takeover.

The takeover protocol is reboot.py's, on the same abstract socket, so the two sides may be a
single process or a supervisor in any mix. A supervisor speaks it for its workers:

- as the old side (OldSide): it owns the takeover socket (its workers open none) and sends
  every listening socket it holds: each worker's TCP sockets and the shared unix socket. When
  the new pgtarn serves them, it drains as SIGTERM would (no worker is restarted; it exits
  when its workers have) and gives each worker one end of a new socketpair ("drain"): the
  worker runs reboot.py's Handover on it, exactly as a single process does with the new
  pgtarn, and the supervisor relays between them: the worker's "client" requests (socket and
  state) go to the new pgtarn and its answers come back; the new pgtarn's "cancel"s go to
  every worker.
- as the new side (NewSide): it spreads the sockets it took over its M workers (spread()),
  starts them, says "serving", and passes each client it is sent to the worker that its
  cancel key names (worker_of(key) % M), which adopts it (reboot.adopt_message). Its workers
  send it the CancelRequests whose keys they do not know ("reboot_cancel"); it forwards them
  to the old pgtarn while it runs, and to the worker that took a handed client whose key
  names a worker beyond M.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Coroutine
from typing import Any, Protocol

from ..proto.cancelkey import worker_of
from ..workers.channel import Channel, ChannelClosed
from ..workers.sockets import tcp_listeners
from ..workers.wire import Message
from .reboot import REPLY_TIMEOUT, ask_for_sockets, connect, log_done
from .takeover import accept_takeover, takeover_address, takeover_listener

log = logging.getLogger("pgtarn")

#: What a new worker sends its supervisor for a CancelRequest whose key it does not know.
CANCEL_KIND = "reboot_cancel"


class WorkerView(Protocol):
    """A worker as the supervisor holds it (supervisor.Worker)."""

    index: int
    sockets: list[socket.socket]
    channel: Channel | None


class SupervisorView(Protocol):
    """What a takeover uses of the Supervisor."""

    @property
    def workers(self) -> list[Any]: ...

    unix: socket.socket | None
    unix_path: str | None
    stopping: signal.Signals | None
    keep_pidfile: bool
    takeover: Any
    takeover_listener: socket.socket | None

    def _finish(self) -> None: ...


def _spawn(tasks: set[asyncio.Task[None]], coroutine: Coroutine[Any, Any, None]) -> None:
    task = asyncio.get_running_loop().create_task(coroutine)
    tasks.add(task)
    task.add_done_callback(tasks.discard)


# --- the old supervisor -----------------------------------------------------------------------


def open_listener(sup: SupervisorView, port: int) -> None:
    """Listen for a new pgtarn started with --reboot (the supervisor's; workers open none)."""
    sup.takeover_listener = takeover_listener(port)
    if sup.takeover_listener is not None:
        asyncio.get_running_loop().add_reader(sup.takeover_listener.fileno(), _asked, sup)


def _asked(sup: SupervisorView) -> None:
    conn = accept_takeover(
        sup.takeover_listener,
        sup.stopping is not None or (sup.takeover is not None and not sup.takeover.channel.closed),
    )
    if conn is not None:
        sup.takeover = OldSide(sup, conn)


def close_listener(sup: SupervisorView) -> None:
    listener, sup.takeover_listener = sup.takeover_listener, None
    if listener is not None:
        asyncio.get_running_loop().remove_reader(listener.fileno())
        listener.close()


class OldSide:
    """The old supervisor's side of one takeover (module docstring)."""

    def __init__(self, sup: SupervisorView, conn: socket.socket) -> None:
        self.sup = sup
        self.channel = Channel(conn, self._message, self._closed, name="takeover channel")
        self.relays: list[Channel] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.handed = 0
        self.refused = 0

    def _message(self, channel: Channel, message: Message, fds: list[int]) -> None:
        kind = message.get("kind")
        sup = self.sup
        if kind == "takeover":
            # a socket that workers share is sent once
            socks = list(dict.fromkeys(s for worker in sup.workers for s in worker.sockets))
            if sup.unix is not None:
                socks.append(sup.unix)
            log.info(
                "takeover: pid %s asks for the listening sockets; sending %d",
                message.get("pid"),
                len(socks),
            )
            channel.reply(
                message,
                {"unix_path": sup.unix_path, "pid": os.getpid()},
                [sock.fileno() for sock in socks],
            )
        elif kind == "serving":
            self._serving()
            channel.reply(message, {})
        elif kind == "cancel":
            key = message.get("key")
            for relay in self.relays:
                if not relay.closed:
                    relay.send({"kind": "cancel", "key": key})
        elif "id" in message:
            channel.reply(message, {"error": f"unknown message {kind!r}"})

    def _serving(self) -> None:
        sup = self.sup
        live = [w for w in sup.workers if w.channel is not None]
        log.info(
            "takeover: the new process serves; %d workers drain and hand over their idle clients",
            len(live),
        )
        # as SIGTERM: no worker is restarted, and the supervisor exits when they all have
        sup.stopping = signal.SIGTERM
        sup.unix_path = None  # the socket file is the new process's now
        sup.keep_pidfile = True
        close_listener(sup)
        for worker in live:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            relay = Channel(
                ours, self._from_worker, _relay_closed, name=f"worker {worker.index} handover"
            )
            self.relays.append(relay)
            _spawn(self.tasks, self._drain(worker.channel, theirs))
            relay.send({"kind": "serving", "id": 0})  # its Handover stops accepting
        if not live:
            sup._finish()

    async def _drain(self, channel: Channel, theirs: socket.socket) -> None:
        try:
            await channel.request({"kind": "drain"}, REPLY_TIMEOUT, [theirs.fileno()])
        except (ChannelClosed, TimeoutError):
            pass  # the worker is gone (its exit is followed by the supervisor)
        finally:
            theirs.close()

    def _from_worker(self, relay: Channel, message: Message, fds: list[int]) -> None:
        if message.get("kind") == "client" and len(fds) == 1 and "id" in message:
            _spawn(self.tasks, self._relay_client(relay, message, fds[0]))
            return
        for fd in fds:
            os.close(fd)
        if "id" in message and message.get("re") is None:
            relay.reply(message, {"error": "unknown message"})

    async def _relay_client(self, relay: Channel, message: Message, fd: int) -> None:
        try:
            reply, _fds = await self.channel.request(
                {"kind": "client", "client": message.get("client")}, REPLY_TIMEOUT - 1, [fd]
            )
        except ChannelClosed:
            reply = {"error": "the new process is gone"}
        except TimeoutError:
            return  # the worker gives up on it too (and closes its copy)
        finally:
            os.close(fd)
        reply.pop("re", None)
        if reply.get("error"):
            self.refused += 1
        else:
            self.handed += 1
        if not relay.closed:
            relay.reply(message, reply)

    def _closed(self, channel: Channel) -> None:
        for relay in self.relays:
            relay.close()

    def finish(self) -> None:
        """The supervisor exits (its workers have)."""
        log.info(
            "takeover: %d clients handed over by the workers, %d refused by the new process",
            self.handed,
            self.refused,
        )
        self.channel.close()


def _relay_closed(channel: Channel) -> None:
    """A worker's handover ends with the worker."""


# --- the new supervisor -----------------------------------------------------------------------


class NewSide:
    """The new supervisor's side: the sockets, then clients for its workers."""

    def __init__(self, sup: SupervisorView, sock: socket.socket) -> None:
        self.sup = sup
        self.channel = Channel(sock, self._message, self._closed, name="takeover channel")
        self.tasks: set[asyncio.Task[None]] = set()
        self.adopted = 0
        self.old_pid = 0

    async def listening_sockets(self) -> tuple[list[socket.socket], str | None]:
        socks, path, self.old_pid = await ask_for_sockets(self.channel)
        return socks, path

    async def serving(self) -> None:
        """Our workers accept on the sockets: the old pgtarn stops."""
        await self.channel.request({"kind": "serving"}, REPLY_TIMEOUT)

    def cancel(self, key: list[int]) -> None:
        """A CancelRequest no worker of ours knows the key of."""
        if not self.channel.closed:
            self.channel.send({"kind": "cancel", "key": key})

    def _message(self, channel: Channel, message: Message, fds: list[int]) -> None:
        if message.get("kind") == "client" and len(fds) == 1 and "id" in message:
            _spawn(self.tasks, self._place(message, fds[0]))
            return
        for fd in fds:
            os.close(fd)
        if "id" in message:
            channel.reply(message, {"error": "unknown message"})

    async def _place(self, message: Message, fd: int) -> None:
        workers = self.sup.workers
        state = message.get("client")
        key = state.get("cancel_key") if isinstance(state, dict) else None
        index = worker_of((key[0], 0)) % len(workers) if isinstance(key, list) and key and \
            isinstance(key[0], int) else 0  # fmt: skip
        target = workers[index].channel
        try:
            if target is None:
                raise ChannelClosed(f"worker {index} is not running")
            reply, _fds = await target.request(
                {"kind": "adopt", "client": state}, REPLY_TIMEOUT - 2, [fd]
            )
        except ChannelClosed as exc:
            reply = {"error": str(exc)}
        except TimeoutError:
            return  # the old side gives up on it and closes its copy
        finally:
            os.close(fd)
        reply.pop("re", None)
        if not reply.get("error"):
            self.adopted += 1
        if not self.channel.closed:
            self.channel.reply(message, reply)

    def finish(self) -> None:
        self.channel.close()

    def _closed(self, channel: Channel) -> None:
        log_done(self.old_pid, self.adopted)


async def take_over(
    sup: SupervisorView, port: int
) -> tuple[list[socket.socket], str | None] | None:
    """--reboot: the listening sockets of the pgtarn on port, and its unix socket's path
    (None: none runs there). sup.takeover is the NewSide; it says "serving" once the
    workers are started."""
    sock = await connect(takeover_address(port))
    if sock is None:
        return None
    side = NewSide(sup, sock)
    socks, path = await side.listening_sockets()
    sup.takeover = side
    return socks, path


def spread(
    socks: list[socket.socket], count: int, backlog: int
) -> tuple[list[list[socket.socket]], socket.socket | None]:
    """The taken-over sockets as count workers' TCP sockets, and the shared unix socket.

    Every socket goes on being served (a closed SO_REUSEPORT socket would drop the
    connections queued on it): with more sockets on an address than workers, a worker
    serves several; with fewer, extra SO_REUSEPORT sockets are bound for the others, or,
    when the old sockets lack SO_REUSEPORT (a single process made them), the workers
    share them as they share the unix socket.
    """
    unix: socket.socket | None = None
    groups: dict[tuple[int, Any], list[socket.socket]] = {}
    for sock in socks:
        sock.setblocking(False)
        if sock.family == socket.AF_UNIX and unix is None:
            unix = sock
            continue
        groups.setdefault((sock.family, sock.getsockname()), []).append(sock)
    made: list[list[socket.socket]] = [[] for _ in range(count)]
    for (_family, address), group in groups.items():
        if len(group) < count and all(_reuseport(s) for s in group):
            with contextlib.suppress(OSError):
                keepalive = bool(group[0].getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE))
                extra = tcp_listeners(
                    [address[0]], address[1], backlog, count - len(group), keepalive
                )  # as the sockets taken over
                group += [s for socks_of in extra for s in socks_of]
        for i in range(max(count, len(group))):
            made[i % count].append(group[i % len(group)])
    return made, unix


def _reuseport(sock: socket.socket) -> bool:
    return sock.family != socket.AF_UNIX and bool(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)
    )


def forward_cancel(sup: SupervisorView, message: Message) -> None:
    """A worker's CancelRequest with a key none of it knows: to the old pgtarn (while it
    runs), and to the worker a handed client with a key naming a worker beyond ours went
    to (which does not pass it on again)."""
    key = message.get("key")
    if not (isinstance(key, list) and len(key) == 2 and all(isinstance(k, int) for k in key)):
        return
    if isinstance(sup.takeover, NewSide):
        sup.takeover.cancel(key)
    workers = sup.workers
    owner = worker_of((key[0], key[1]))
    if owner >= len(workers):
        channel = workers[owner % len(workers)].channel
        if channel is not None:
            channel.send({"kind": "cancel", "key": key, "last": True})
